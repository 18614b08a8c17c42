"""Test tiers: every test is exactly one of ``unit``, ``integration`` or ``e2e`` (README "Tests").

unit         no processes, no network sockets, no broker, no LSL; seconds. Real EEG files and in-memory doubles
             (tests/broker/memory_broker.py) are fine. Enforced: tests/conftest.py fails a unit test that starts
             a process, opens an internet socket or creates an LSL outlet, inlet or resolver.
integration  a real Mosquitto (127.0.0.1:1883 or a test's own on a free port), LSL on loopback, subprocesses
             where the behaviour needs them (a CLI's exit code, a process's signals), real EEG.
e2e          the demo, the apps in a real browser / Node, kill -9 and resume, whole CLI runs of a pipeline.

How a test gets its tier: an explicit ``@pytest.mark.unit`` / ``integration`` / ``e2e`` on the test (or
``pytestmark`` in its module) wins; then :data:`TEST_TIERS` (a few single tests listed here); otherwise
its file's tier from :data:`FILE_TIERS` below. A test with no
tier, or with two, stops the run at collection (tests/conftest.py); tests/test_tiers.py checks the table.
Select a tier with ``-m unit`` (``-m "not e2e"``, ...).

Tiers are a table rather than folders (tests/unit/..., tests/integration/...): the files stay where they
mirror the package tree, so ``tests/broker/test_transport.py`` is still next to the transport's other tests
and no import line or docs reference changes; a file with tests of several tiers marks the exceptions on
the tests themselves.
"""

from __future__ import annotations

TIERS = ("unit", "integration", "e2e")

#: file (relative to the repository) -> the tier of its tests that carry no explicit tier mark
FILE_TIERS: dict[str, str] = {
    # broker/
    "tests/broker/test_cluster.py": "integration",            # a 3-node RabbitMQ cluster (skips without it)
    "tests/broker/test_coordinator_cli.py": "integration",   # 2 unit tests marked in the file
    "tests/broker/test_async_mqtt.py": "unit",                # the real-process case is marked integration
    "tests/broker/test_release_gate.py": "unit",              # the in-memory broker
    "tests/broker/test_long_lived_e2e.py": "e2e",             # Mosquitto, headset-sim, infer --follow processes
    "tests/broker/test_equivalence.py": "unit",               # the real-process case is marked integration
    "tests/broker/test_fedbm_wire.py": "integration",
    "tests/broker/test_fleet_broker.py": "integration",       # 1 unit test marked in the file
    "tests/broker/test_fuzz.py": "integration",
    "tests/broker/test_hostile.py": "integration",            # 1 unit test marked in the file
    "tests/broker/test_memory_broker.py": "unit",
    "tests/broker/test_profiles_mqtt.py": "integration",      # 1 unit, 1 e2e (kill -9 and resume) marked
    "tests/broker/test_protocol.py": "unit",
    "tests/broker/test_reliability.py": "e2e",
    "tests/broker/test_rounds.py": "unit",                # kill -9, resume, broker restart mid-training
    "tests/broker/test_secagg_mqtt.py": "integration",        # 1 unit test marked in the file
    "tests/broker/test_secagg_round.py": "unit",
    "tests/broker/test_secagg_swarm.py": "integration",
    "tests/broker/test_secure_broker.py": "integration",      # 1 unit test marked in the file
    "tests/broker/test_transport.py": "integration",
    "tests/broker/test_validation.py": "unit",
    # edge/
    "tests/edge/test_bridge.py": "integration",               # LSL + WebSocket on loopback; 1 unit test marked
    "tests/edge/test_capture.py": "integration",              # LSL on loopback
    "tests/edge/test_capture_cli.py": "integration",          # 1 e2e (kill -9 and restart) marked
    "tests/edge/test_capture_mnelsl.py": "integration",
    "tests/edge/test_federation_state.py": "unit",
    "tests/edge/test_guard.py": "unit",
    "tests/edge/test_infer.py": "unit",
    "tests/edge/test_follow.py": "unit",
    "tests/edge/test_follow_mqtt.py": "integration",  # real Mosquitto, LSL headset-sim, the infer CLI
    "tests/edge/test_infer_lsl.py": "integration",
    "tests/edge/test_join_cli.py": "integration",
    "tests/edge/test_join_profiles.py": "unit",
    "tests/edge/test_lsl_bench.py": "e2e",                    # a whole `neurofed bench lsl` run
    "tests/edge/test_lsl_buffer.py": "integration",           # 3 unit tests (ring buffer) marked
    "tests/edge/test_lsl_config.py": "integration",           # 2 unit tests in TEST_TIERS
    "tests/edge/test_record_profiles.py": "integration",
    "tests/edge/test_secagg_client.py": "unit",
    "tests/edge/test_store.py": "unit",                       # 1 e2e (kill -9 during appends) marked
    "tests/edge/test_stream.py": "unit",
    # export/
    "tests/export/test_apps.py": "e2e",                       # Node and a real browser; 1 unit test marked
    "tests/export/test_apps_live.py": "e2e",                  # headset-sim + bridge + a real browser and Node
    "tests/export/test_apps_follow.py": "integration",        # Node following signed releases over a real Mosquitto
    "tests/export/test_app_serve.py": "integration",          # a wheel's `neurofed app serve` outside the checkout
    "tests/export/test_bench.py": "unit",
    "tests/export/test_bundle_training.py": "unit",
    "tests/export/test_classical_onnx.py": "unit",
    "tests/export/test_evaluate.py": "unit",                  # 1 integration (CLI process) marked
    "tests/export/test_export.py": "unit",                    # 1 integration (CLI process) marked
    "tests/export/test_import_rule.py": "unit",
    "tests/export/test_profiles_export.py": "unit",           # 1 integration (LSL + CLI) marked
    "tests/export/test_quantize.py": "unit",
    "tests/export/test_standalone.py": "unit",
    # runtime/ (the neurofed-runtime distribution)
    "tests/runtime/test_model.py": "unit",
    "tests/runtime/test_decode.py": "unit",
    "tests/runtime/test_release.py": "unit",
    "tests/runtime/test_follow.py": "unit",                   # a Decoder swapping to signed releases (no broker)
    "tests/runtime/test_follow_mqtt.py": "integration",       # the runtime's subscriber over a real Mosquitto
    "tests/runtime/test_lsl.py": "integration",               # live LSL, mne-lsl's StreamLSL, CLIs
    "tests/runtime/test_venv.py": "e2e",                      # a fresh venv with the runtime alone (no torch)
    # firmware_sim/
    "tests/firmware_sim/test_cli.py": "integration",
    "tests/firmware_sim/test_player.py": "integration",       # LSL; 3 unit tests marked
    "tests/firmware_sim/test_profile.py": "unit",             # 2 integration (CLI streaming) marked
    # neurofed/
    "tests/neurofed/test_bench_e2e.py": "e2e",                # 1 integration (bad options) marked
    "tests/neurofed/test_bench_fleet.py": "integration",
    "tests/neurofed/test_bench_swap.py": "e2e",               # headset-sim, an infer process, Mosquitto (~30 s)
    "tests/neurofed/test_bench_secagg.py": "unit",
    "tests/neurofed/test_demo.py": "e2e",
    "tests/neurofed/test_docsite.py": "unit",
    "tests/neurofed/test_preflight.py": "unit",
    "tests/neurofed/test_release_report.py": "unit",
    "tests/neurofed/test_supervise.py": "integration",
    "tests/neurofed/test_wiretap.py": "integration",          # 1 unit test marked
    # repository-wide
    "tests/test_docs.py": "unit",                             # the site's generated pages, without Sphinx
    "tests/test_import_contract.py": "unit",                  # 2 integration in TEST_TIERS
    "tests/test_lint.py": "integration",                      # runs ruff as a process
    "tests/test_packaging.py": "integration",                 # pip, git, clean venvs (its tests carry their marks)
    "tests/test_tiers.py": "unit",
    # trainer/
    "tests/trainer/test_art_attacks.py": "unit",
    "tests/trainer/test_attacks.py": "unit",
    "tests/trainer/test_bench.py": "unit",
    "tests/trainer/test_checkpoint.py": "unit",
    "tests/trainer/test_classical.py": "unit",
    "tests/trainer/test_cli.py": "unit",                      # 1 integration, 1 e2e in TEST_TIERS
    "tests/trainer/test_data.py": "unit",                     # 1 integration (a loader process) marked
    "tests/trainer/test_ensemble.py": "unit",
    "tests/trainer/test_fal.py": "unit",
    "tests/trainer/test_fed_classical.py": "unit",
    "tests/trainer/test_fedavgm.py": "unit",
    "tests/trainer/test_fedbuff.py": "unit",
    "tests/trainer/test_asyncsim.py": "unit",
    "tests/trainer/test_augment.py": "unit",
    "tests/trainer/test_fedbm.py": "unit",
    "tests/trainer/test_fedfa.py": "unit",
    "tests/trainer/test_fl.py": "unit",
    "tests/trainer/test_vectorised.py": "unit",
    "tests/trainer/test_fleeg_proj.py": "unit",
    "tests/trainer/test_ga.py": "unit",
    "tests/trainer/test_grid.py": "unit",                     # 3 integration (Ray, process pools) marked
    "tests/trainer/test_hierarchical.py": "unit",
    "tests/trainer/test_moabb_offline.py": "unit",
    "tests/trainer/test_models.py": "unit",
    "tests/trainer/test_partition.py": "unit",
    "tests/trainer/test_profiles.py": "unit",
    "tests/trainer/test_raw.py": "unit",
    "tests/trainer/test_registry.py": "unit",
    "tests/trainer/test_report.py": "unit",
    "tests/trainer/test_robust.py": "unit",
    "tests/trainer/test_secagg.py": "unit",
    "tests/trainer/test_sklearn_honest.py": "unit",
    "tests/trainer/test_spec.py": "unit",
    "tests/trainer/test_studies.py": "unit",
    "tests/trainer/test_strategy_regression.py": "e2e",       # a whole `neurofed simulate` at the reference commit
    "tests/trainer/test_sweep.py": "unit",                    # 1 integration (process pool) marked
    "tests/trainer/test_tta.py": "unit",
}

#: single tests of files that do not import pytest or are another branch's to edit (file::test name -> tier;
#: parametrised cases share it)
TEST_TIERS: dict[str, str] = {
    # the import-linter CLI and a clean interpreter as processes
    "tests/test_import_contract.py::test_lint_imports_on_the_staging_tree": "integration",
    "tests/test_import_contract.py::test_runtime_imports_no_torch": "integration",
    "tests/test_import_contract.py::test_the_cli_loads_no_pylsl": "integration",
    "tests/edge/test_lsl_config.py::test_session_config_text": "unit",
    "tests/edge/test_lsl_config.py::test_a_base_port_without_room_is_refused": "unit",
    "tests/trainer/test_cli.py::test_bad_data_dir_is_one_clear_line": "integration",  # the CLI as a process
    # a whole `neurofed simulate` in process, then resumed by a second run as a process
    "tests/trainer/test_cli.py::test_simulate_ct_loso_writes_results_and_resumes": "e2e",
}

#: files whose non-unit tests stream over LSL (or run the demo, which does): two xdist groups ("lsl", and "lsl2"
#: for LSL_SECOND_GROUP below), so under ``-n`` at most two run at a time. Sessions are private per worker process (tests/lsl_support.py),
#: but every session on the machine takes its service ports from the same 128-port range (edge/lsl_config.py),
#: and two workers opening dozens of outlets and resolvers at once could push outlets out of it.
LSL_FILES = frozenset({
    "tests/edge/test_capture.py", "tests/edge/test_capture_cli.py", "tests/edge/test_capture_mnelsl.py",
    "tests/edge/test_infer_lsl.py", "tests/edge/test_lsl_bench.py", "tests/edge/test_lsl_buffer.py",
    "tests/edge/test_lsl_config.py", "tests/edge/test_record_profiles.py",
    "tests/export/test_profiles_export.py", "tests/runtime/test_lsl.py", "tests/edge/test_bridge.py",
    "tests/export/test_apps_live.py", "tests/edge/test_follow_mqtt.py",
    "tests/firmware_sim/test_cli.py", "tests/firmware_sim/test_player.py", "tests/firmware_sim/test_profile.py",
    "tests/neurofed/test_bench_e2e.py", "tests/neurofed/test_demo.py", "tests/neurofed/test_bench_swap.py",
    "tests/broker/test_long_lived_e2e.py",
})

#: LSL files that form the second group ("lsl2"): one group alone (540 s of the suite's 1,521 worker-s, 3 workers)
#: was the suite's critical path. Balanced by measured wall time (~270 s each, docs/BENCHMARKS.md "Test suite").
#: Each worker's LSL session has its own liblsl port range (tests/lsl_support.py), so two groups do not crowd one.
LSL_SECOND_GROUP = frozenset({
    "tests/export/test_apps_live.py", "tests/edge/test_infer_lsl.py", "tests/broker/test_long_lived_e2e.py",
    "tests/edge/test_follow_mqtt.py", "tests/edge/test_capture.py", "tests/firmware_sim/test_player.py",
    "tests/edge/test_lsl_bench.py", "tests/edge/test_lsl_buffer.py", "tests/edge/test_record_profiles.py",
    "tests/edge/test_lsl_config.py",
})

#: files whose tests share an expensive module-scoped set-up: one xdist group each, so ``-n`` runs the set-up
#: once (on one worker) rather than once per worker
SHARED_SETUP_FILES = {
    "tests/trainer/test_strategy_regression.py": "strategy_regression",  # the reference commit's runs (~15 s)
    "tests/broker/test_cluster.py": "rabbitmq_cluster",  # a 3-node RabbitMQ cluster (~30 s to start)
    "tests/trainer/test_ensemble.py": "ensemble",  # three small federations with saved models
    # both build the wheel in the checkout (setuptools' build/ folder): one at a time
    "tests/test_packaging.py": "wheel_build",
    "tests/export/test_app_serve.py": "wheel_build",
}
