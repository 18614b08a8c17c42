"""``neurofed bench data`` and ``neurofed bench train``: pipeline and training-step benchmarks."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from neurofed.trainer.data import PreprocessConfig, load_eegmmidb_subject
from neurofed.trainer.data.eegmmidb import parse_subjects

BENCH_DIR = Path("docs/bench")


def write_result(name: str, result: dict, out_dir: Path = BENCH_DIR) -> Path:
    """Write a benchmark's JSON (with machine facts) to ``docs/bench/<name>.json``.

    The platform string is built from ``os.uname`` (system, release, machine): ``platform.platform()`` runs
    ``uname -p`` in a subprocess, which a unit test may not start.
    """
    import platform

    import torch

    out_dir.mkdir(parents=True, exist_ok=True)
    result = {"benchmark": name, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "machine": {"cpu_count": os.cpu_count(), "platform": "-".join(os.uname()[i] for i in (0, 2, 4)),
                          "python": platform.python_version(), "torch": torch.__version__,
                          "torch_threads": torch.get_num_threads(),
                          "load_average_1m": os.getloadavg()[0]}, **result}
    p = out_dir / f"{name}.json"
    p.write_text(json.dumps(result, indent=1))
    return p


def peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def bench_data(subjects: str = "1-5", channels: str = "sensorimotor21", resample: float | None = 80.0,
               data_dir: str | None = None, out_dir: Path = BENCH_DIR) -> None:
    """EDF load + preprocess time per subject, cold (empty cache) vs cached."""

    cfg = PreprocessConfig.from_preset(channels, resample=resample)
    subs = parse_subjects(subjects, data_dir)
    cold, warm = [], []
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["NEUROFED_CACHE"] = tmp
        for s in subs:
            t = time.perf_counter()
            load_eegmmidb_subject(s, cfg, data_dir)
            cold.append(time.perf_counter() - t)
            t = time.perf_counter()
            load_eegmmidb_subject(s, cfg, data_dir)
            warm.append(time.perf_counter() - t)
    res = {"command": f"neurofed bench data --subjects {subjects} --channels {channels} --resample {resample}",
           "subjects": subs, "cold_s_per_subject": float(np.mean(cold)), "cached_s_per_subject": float(np.mean(warm)),
           "speedup": float(np.mean(cold) / np.mean(warm)), "cold_all": cold, "cached_all": warm,
           "peak_rss_mb": peak_rss_mb()}
    p = write_result("data", res, out_dir)
    print(f"cold {res['cold_s_per_subject'] * 1000:.0f} ms/subject, cached {res['cached_s_per_subject'] * 1000:.1f} "
               f"ms/subject ({res['speedup']:.0f}x) -> {p}")


def bench_train(threads: int = 1, batch_size: int = 32, steps: int = 30, models: str = "eegnet,shallow,deep",
                out_dir: Path = BENCH_DIR) -> None:
    """Training throughput (trials/s) per model and step cost of SAM and SAFE relative to SGD.

    Medians of wall time and of the calling thread's CPU time (``time.thread_time``; with one torch
    thread all the work runs there), so the ratios can be read on a machine other jobs share.
    """
    import torch

    from neurofed.trainer.fl.local import LocalConfig, train_local  # lazy: torch (loaded only when used)
    from neurofed.trainer.fl.strategies import get_strategy  # lazy: torch (loaded only when used)
    from neurofed.trainer.models import build_model, count_parameters  # lazy: torch (loaded only when used)

    torch.set_num_threads(threads)
    shapes = {"21ch x 80Hz x 4s": (21, 320, 80.0), "64ch x 160Hz x 4s": (64, 640, 160.0)}
    rows = []
    rng = np.random.default_rng(0)
    for shape_name, (c, t, sf) in shapes.items():
        X = rng.standard_normal((batch_size * 4, c, t)).astype(np.float32)
        y = rng.integers(0, 2, len(X))
        for model_name in models.split(","):
            if model_name == "deep" and t < 441:
                continue
            # interleave the three step kinds and take medians, so machine load hits them alike
            per_alg, cfg = {}, LocalConfig(batch_size=batch_size, local_epochs=1)
            for alg in ("fedavg", "fedbs", "safe"):
                strat = get_strategy(alg)
                per_alg[alg] = (strat, build_model(model_name, c, 2, t, sf, strat.bn_mode))
            xb, yb = X[:batch_size], y[:batch_size]
            wall: dict[str, list[float]] = {a: [] for a in per_alg}
            cpu: dict[str, list[float]] = {a: [] for a in per_alg}
            passes = {}  # forward passes of the model in one step: what the ratios track
            for i in range(steps + 1):
                for alg, (strat, model) in per_alg.items():
                    if i == 0:  # warm-up, not timed: count the passes instead
                        count = [0]
                        hook = model.register_forward_pre_hook(lambda *_a, n=count: n.__setitem__(0, n[0] + 1))
                        train_local(model, xb, yb, strat, cfg, 0)
                        hook.remove()
                        passes[alg] = count[0]
                        continue
                    t0, c0 = time.perf_counter(), time.thread_time()
                    train_local(model, xb, yb, strat, cfg, 0)
                    wall[alg].append(time.perf_counter() - t0)
                    cpu[alg].append(time.thread_time() - c0)
            timings = {a: float(np.median(v)) for a, v in wall.items()}
            cpu_t = {a: float(np.median(v)) for a, v in cpu.items()}
            model = per_alg["fedavg"][1]
            rows.append({"shape": shape_name, "model": model_name, "params": count_parameters(model),
                         "sgd_step_ms": 1000 * timings["fedavg"], "sgd_trials_per_s": batch_size / timings["fedavg"],
                         "sam_over_sgd": timings["fedbs"] / timings["fedavg"],
                         "safe_over_sgd": timings["safe"] / timings["fedavg"],
                         "sgd_step_cpu_ms": 1000 * cpu_t["fedavg"],
                         "sam_over_sgd_cpu": cpu_t["fedbs"] / cpu_t["fedavg"],
                         "safe_over_sgd_cpu": cpu_t["safe"] / cpu_t["fedavg"],
                         "forward_passes_per_step": {"sgd": passes["fedavg"], "sam": passes["fedbs"],
                                                     "safe": passes["safe"]}})
            r = rows[-1]
            print(f"{shape_name:18s} {model_name:8s} SGD {r['sgd_step_ms']:.1f} ms/step "
                       f"({r['sgd_trials_per_s']:.0f} trials/s)  SAM x{r['sam_over_sgd']:.2f} "
                       f"(CPU x{r['sam_over_sgd_cpu']:.2f})  SAFE x{r['safe_over_sgd']:.2f} "
                       f"(CPU x{r['safe_over_sgd_cpu']:.2f})")
    res = {"command": f"neurofed bench train --threads {threads} --batch-size {batch_size} --steps {steps} "
                      f"--models {models}",
           "batch_size": batch_size, "threads": threads, "rows": rows, "peak_rss_mb": peak_rss_mb()}
    print(f"-> {write_result('train', res, out_dir)}")




def bench_simulate(algorithms: str = "fedbs,safe", subjects: str = "all", rounds: int = 1, fraction: float = 0.5,
                   model: str = "eegnet", threads: int = 1, data_dir: str | None = None,
                   out_dir: Path = BENCH_DIR, name: str = "simulate", repeats: int = 2) -> dict:
    """The same short federation with the sequential and the vectorised engine in one process.

    The clients are the training subjects of fold 0 of ``kfold:5`` (46 subjects: 37 clients, 18 per round at
    fraction 0.5), the published protocol (21 channels at 80 Hz, batch 8, 2 local epochs). Per engine and
    algorithm: rounds/s and passes/s (a pass = one forward+backward of one client batch; FedBS 2 per step,
    SAFE 3: FGSM, loss, perturbed), wall and CPU time (``time.thread_time``: comparable on a shared machine);
    the engines' ratio; the pure-compute floor (plain forward+backward of the model at batch clients x batch
    over the same number of samples); the largest difference between the engines' final global states. Each engine
    runs the federation ``repeats`` times, interleaved with the other (times are means over the repeats).
    """
    import torch

    from neurofed.trainer.experiments.protocol import make_folds  # lazy: torch (loaded only when used)
    from neurofed.trainer.experiments.runner import run_federated  # lazy: torch (loaded only when used)
    from neurofed.trainer.fl.local import LocalConfig, batches  # lazy: torch (loaded only when used)
    from neurofed.trainer.fl.server import select_clients  # lazy: torch (loaded only when used)
    from neurofed.trainer.fl.strategies import get_strategy  # lazy: torch (loaded only when used)
    from neurofed.trainer.models import build_model  # lazy: torch (loaded only when used)

    torch.set_num_threads(threads)
    ids = parse_subjects(subjects, data_dir)
    held = make_folds(ids, "kfold:5", 0)[0] if len(ids) >= 5 else []
    pre = PreprocessConfig.from_preset("sensorimotor21", resample=80.0)
    clients = {sd.subject: sd for sd in (load_eegmmidb_subject(s, pre, data_dir) for s in ids if s not in held)}
    cfg = LocalConfig()
    cids = sorted(clients)
    rows = []
    for alg in algorithms.split(","):
        st = get_strategy(alg)
        per_step = 1 + (st.settings.get("fat_eps", 0) > 0) + (st.settings.get("sam_rho", 0) > 0
                                                              or st.settings.get("awp_gamma", 0) > 0)
        passes = samples = 0
        for r in range(rounds):
            for c in select_clients(cids, fraction, r, 0):
                bs = [len(b) for _ in range(cfg.local_epochs)
                      for b in batches(len(clients[c].X), cfg.batch_size, np.random.default_rng(0))]
                passes += per_step * len(bs)
                samples += per_step * sum(bs)
        per_round = len(select_clients(cids, fraction, 0, 0))
        timing, states = {}, {}
        engines = ("sequential", "vectorised")
        for engine in engines:
            run_federated(clients, model, st, cfg, 1, fraction, 0, engine=engine)  # warm-up (not timed)
        spent = {e: [0.0, 0.0] for e in engines}
        for _ in range(repeats):  # interleaved, so that a change in the machine's load hits both engines alike
            for engine in engines:
                t0, c0 = time.perf_counter(), time.thread_time()
                m, _ = run_federated(clients, model, st, cfg, rounds, fraction, 0, engine=engine)
                spent[engine][0] += time.perf_counter() - t0
                spent[engine][1] += time.thread_time() - c0
                states[engine] = m.state_dict()
        for engine, (wall, cpu) in spent.items():
            wall, cpu = wall / repeats, cpu / repeats
            timing[engine] = {"wall_s": wall, "cpu_s": cpu, "rounds_per_s": rounds / wall,
                              "rounds_per_cpu_s": rounds / cpu, "passes_per_s": passes / wall,
                              "passes_per_cpu_s": passes / cpu}
        # the floor: the plain model, forward+backward at batch (clients x batch) over the round's samples
        ref = clients[cids[0]]
        net = build_model(model, ref.X.shape[1], len(ref.classes), ref.X.shape[2], ref.sfreq, st.bn_mode).train()
        big = per_round * cfg.batch_size
        X = torch.as_tensor(np.concatenate([clients[c].X for c in cids])[:big])
        y = torch.as_tensor(np.concatenate([clients[c].y for c in cids])[:big]).long()
        reps = max(1, round(samples / big))
        torch.nn.functional.cross_entropy(net(X), y).backward()  # warm-up
        t0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(reps):
            net.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(net(X), y).backward()
        fwall, fcpu = (time.perf_counter() - t0) * samples / (reps * big), (time.thread_time() - c0) * samples / (reps * big)
        floor = {"wall_s": fwall, "cpu_s": fcpu, "rounds_per_s": rounds / fwall, "rounds_per_cpu_s": rounds / fcpu,
                 "batch": big, "samples": samples}
        diff = max(float((states["sequential"][k].double() - states["vectorised"][k].double()).abs().max())
                   for k in states["sequential"])
        seq, vec = timing["sequential"], timing["vectorised"]
        row = {"algorithm": alg, "clients": len(cids), "clients_per_round": per_round, "rounds": rounds,
               "passes": passes, **{e: timing[e] for e in timing}, "floor": floor,
               "speedup_wall": seq["wall_s"] / vec["wall_s"], "speedup_cpu": seq["cpu_s"] / vec["cpu_s"],
               "vectorised_over_floor_wall": vec["wall_s"] / fwall, "vectorised_over_floor_cpu": vec["cpu_s"] / fcpu,
               "sequential_over_floor_cpu": seq["cpu_s"] / fcpu, "max_abs_state_difference": diff}
        rows.append(row)
        print(f"{alg}: sequential {seq['rounds_per_s']:.3f} rounds/s ({seq['passes_per_s']:.0f} passes/s), vectorised "
              f"{vec['rounds_per_s']:.3f} rounds/s ({vec['passes_per_s']:.0f} passes/s): x{row['speedup_wall']:.2f} wall, "
              f"x{row['speedup_cpu']:.2f} CPU; floor {floor['rounds_per_s']:.3f} rounds/s (vectorised/floor "
              f"{row['vectorised_over_floor_cpu']:.2f} CPU); max |state difference| {diff:.1e}", flush=True)
    res = {"command": f"neurofed bench simulate --algorithms {algorithms} --subjects {subjects} --rounds {rounds} "
                      f"--fraction {fraction} --model {model} --threads {threads} --repeats {repeats}",
           "held_out": held, "repeats": repeats, "rows": rows, "peak_rss_mb": peak_rss_mb()}
    p = write_result(name, res, out_dir)
    print(f"-> {p}")
    return res
