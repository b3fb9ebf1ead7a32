"""Retire's vLLM integration (import name ``retire_vllm``), built against vLLM 0.32.0 on CPU.

``facade`` is the integration itself: ``RetireEngine`` runs ``retire_core.Retire`` unchanged as
the control logic of an in-process vLLM engine (``RetireFleet``: several engines sharing
nothing); ``scheduler`` holds ``RetireScheduler`` (the ``scheduler_cls`` subclass with the write
and commit gates); ``identity`` the prefix identities and fingerprints the core compares;
``checker`` the clean-reference checker and the isolation audit; ``faults`` fault injection for
tests.  Groundwork: ``default_model`` builds the tiny deterministic test model, ``engine_config``
holds the engine settings known to work on CPU, ``introspect`` is the single place that reaches
into vLLM internals, ``hooks`` lists and checks every vLLM symbol relied on, and ``experiments``
reproduces the findings in ``docs/vllm_research.md``.  ``install_cpu.sh`` installs the pinned
CPU build.  See ``docs/vllm.md``.  Importing this package does not import vLLM or torch.
"""
