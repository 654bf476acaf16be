"""scripts/bench/vs_llamacpp.sh's parsing and report (standard library only).

    parse-tpr   --dtype D --row R --rep N < tpr bench model --json output
    parse-llama --tool T --dtype D --row R --rep N [--log FILE] < llama-bench -o json
                (or llama-batched-bench --output-format jsonl) output
    wait-idle   [--max-wait S] [--threshold F]
    run         --meter FILE -- COMMAND...   (COMMAND's status; FILE: what else ran)
    report      --results FILE --keep median|best ... [--json]

Each parse prints one JSON line {"engine", "dtype", "row", "rep", "tok_s",
...}; report keeps the median or the best run per engine, dtype and row and
prints the table of tpr / llama.cpp ratios, or one JSON object.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

ROWS = [
    ("p64", "prefill 64"),
    ("p512", "prefill 512"),
    ("d1", "decode, batch 1"),
    ("d8", "decode, batch 8 (aggregate)"),
    ("d4k", "decode at 4k context"),
]


def cpu_jiffies():
    """(busy, total) jiffies of all CPUs from /proc/stat's first line."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    user, nice, system, idle, iowait, irq, softirq, steal = v
    return user + nice + system + irq + softirq + steal, sum(v)


def busy_fraction(seconds):
    b0, t0 = cpu_jiffies()
    time.sleep(seconds)
    b1, t1 = cpu_jiffies()
    return (b1 - b0) / max(t1 - t0, 1)


def wait_idle(a):
    """Waits until the CPUs are at most --threshold busy over a second (other
    people's builds share the machine), at most --max-wait seconds; prints
    the last busy fraction."""
    start, f = time.time(), busy_fraction(1.0)
    while f > a.threshold and time.time() - start < a.max_wait:
        f = busy_fraction(1.0)
    print(f"{f:.3f}")


def run_metered(a):
    """Runs the command; --meter gets the share of the CPUs that other
    processes used while it ran (the machine's busy jiffies less the
    command's own user + system time)."""
    cmd = a.command[1:] if a.command and a.command[0] == "--" else a.command
    ncpu = os.cpu_count() or 1
    hz = os.sysconf("SC_CLK_TCK")
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    b0, t0 = cpu_jiffies()
    w0 = time.time()
    rc = subprocess.call(cmd)
    wall = time.time() - w0
    b1, t1 = cpu_jiffies()
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    own = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    others = max(0.0, (b1 - b0) / hz - own) / max(wall * ncpu, 1e-9)
    with open(a.meter, "w") as f:
        json.dump({"wall_s": wall, "own_cpu_s": own, "others_cpu_fraction": others, "cpus": ncpu}, f)
    sys.exit(rc)


def last_json(text, what):
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    sys.exit(f"vs_llamacpp.py: no JSON object in the output of {what}")


def meter(a):
    """The run's --meter record and the busy fraction seen before it."""
    m = json.load(open(a.meter)) if a.meter else {}
    if a.busy_before is not None:
        m["busy_before"] = a.busy_before
    return m


def parse_tpr(a):
    out = last_json(sys.stdin.read(), "tpr bench model")
    r = {"engine": "tpr", "dtype": a.dtype, "row": a.row, "rep": a.rep, **meter(a)}
    if a.row == "d4k":  # --context: {"contexts": [{"context", "decode_tok_s", ...}]}
        c = out["contexts"][0]
        r.update(tok_s=c["decode_tok_s"], context=c["context"], prefill_tok_s=c["prefill_tok_s"])
    elif a.row.startswith("p"):
        r.update(tok_s=out["prefill_tok_s"])
    else:
        r.update(tok_s=out["decode_tok_s"])
    if "decode_bandwidth_efficiency" in out:  # the run's own roofline (its read probe)
        r.update(weight_dtype=out["weight_dtype"], decode_roofline_fraction=out["decode_bandwidth_efficiency"],
                 decode_roofline_tok_s=out["decode_roofline_tok_s"],
                 machine_read_gbs=out["machine_read_gbs_per_rank"], machine_isa=out.get("machine_isa"))
    print(json.dumps(r))


def parse_llama(a):
    text = sys.stdin.read()
    log = open(a.log, errors="replace").read() if a.log else ""
    r = {"engine": "llama.cpp", "dtype": a.dtype, "row": a.row, "rep": a.rep, "tool": a.tool, **meter(a)}
    if a.tool == "llama-bench":  # -o json: an array, one object per test
        tests = json.loads(text)
        if len(tests) != 1:
            sys.exit(f"vs_llamacpp.py: llama-bench gave {len(tests)} tests, expected 1")
        t = tests[0]
        r.update(tok_s=t["avg_ts"], samples_ts=t["samples_ts"], n_prompt=t["n_prompt"], n_gen=t["n_gen"],
                 n_depth=t.get("n_depth", 0), n_batch=t["n_batch"], n_ubatch=t["n_ubatch"],
                 n_threads=t["n_threads"], flash_attn=t["flash_attn"], type_k=t["type_k"], type_v=t["type_v"],
                 load_mode=t.get("load_mode"), build_commit=t["build_commit"], build_number=t["build_number"],
                 cpu_info=t["cpu_info"], model_type=t["model_type"], model_size=t["model_size"])
    else:  # llama-batched-bench --output-format jsonl: one line per (pp, tg, pl)
        t = last_json(text + "\n" + log, "llama-batched-bench")
        r.update(tok_s=t["speed_tg"], prefill_tok_s=t["speed_pp"], pp=t["pp"], tg=t["tg"], pl=t["pl"],
                 n_batch=t["n_batch"], n_ubatch=t["n_ubatch"], n_threads=t["n_threads"],
                 flash_attn=t["flash_attn"], n_kv_max=t["n_kv_max"])
    print(json.dumps(r))


def report(a):
    runs = [json.loads(l) for l in open(a.results) if l.strip()]
    pick = statistics.median if a.keep == "median" else max
    dtypes = sorted({r["dtype"] for r in runs}, key=["bf16", "f32"].index)
    table = []
    for d in dtypes:
        for row, label in ROWS:
            side = {e: [r for r in runs if r["dtype"] == d and r["row"] == row and r["engine"] == e]
                    for e in ("tpr", "llama.cpp")}
            if not side["tpr"] and not side["llama.cpp"]:
                continue
            # Runs that shared the CPUs with other processes (others used more
            # than --disturbed of them) are left out when quieter ones exist.
            quiet = {e: [r for r in rs if r.get("others_cpu_fraction", 0) <= a.disturbed] or rs
                     for e, rs in side.items()}
            kept = {e: pick([r["tok_s"] for r in rs]) if rs else None for e, rs in quiet.items()}
            entry = {"dtype": d, "row": row, "label": label, "tpr_tok_s": kept["tpr"],
                     "llamacpp_tok_s": kept["llama.cpp"],
                     "ratio": kept["tpr"] / kept["llama.cpp"] if kept["tpr"] and kept["llama.cpp"] else None,
                     "tpr_runs": [r["tok_s"] for r in side["tpr"]],
                     "llamacpp_runs": [r["tok_s"] for r in side["llama.cpp"]],
                     "tpr_runs_others_cpu": [r.get("others_cpu_fraction") for r in side["tpr"]],
                     "llamacpp_runs_others_cpu": [r.get("others_cpu_fraction") for r in side["llama.cpp"]],
                     "kept_from": {e: len(rs) for e, rs in quiet.items()}}
            if row == "d1" and quiet["tpr"]:
                fr = [r["decode_roofline_fraction"] for r in quiet["tpr"]]
                entry.update(tpr_roofline_fraction=pick(fr), tpr_roofline_fraction_runs=fr,
                             tpr_roofline_tok_s=pick([r["decode_roofline_tok_s"] for r in quiet["tpr"]]))
                # llama.cpp reads the same bf16 (or f32) weights per token: its
                # run against the roofline of the tpr run of the same round
                # (measured a minute apart), so the two fractions compare.
                roof = {r["rep"]: r["decode_roofline_tok_s"] for r in quiet["tpr"]}
                lf = [r["tok_s"] / roof[r["rep"]] for r in quiet["llama.cpp"] if r["rep"] in roof]
                if lf:
                    entry.update(llamacpp_roofline_fraction=pick(lf), llamacpp_roofline_fraction_runs=lf)
            table.append(entry)
    llama = [r for r in runs if r["engine"] == "llama.cpp"]
    bench = next((r for r in llama if r["tool"] == "llama-bench"), {})
    tpr_runs = [r for r in runs if r["engine"] == "tpr"]
    setup = {
        "threads": a.threads, "repeat": a.repeat, "kept": a.keep, "config": a.config, "tpr_args": a.tpr_args,
        "cpu_model": a.cpu, "cpu_flags": a.flags.split(),
        "avx512_bf16": "avx512_bf16" in a.flags.split(), "amx_bf16": "amx_bf16" in a.flags.split(),
        "tpr_version": a.tpr_version, "tpr_machine_isa": next((r.get("machine_isa") for r in tpr_runs), None),
        "llamacpp_python": a.llamacpp_python, "llamacpp_build_commit": bench.get("build_commit"),
        "llamacpp_build_number": bench.get("build_number"), "llamacpp_cpu_info": bench.get("cpu_info"),
        "llamacpp_flash_attn": a.llamacpp_fa, "disturbed_threshold": a.disturbed,
        "llamacpp_kv_type": sorted({f'{r["type_k"]}/{r["type_v"]}' for r in llama if "type_k" in r}),
        "llamacpp_load_mode": sorted({str(r.get("load_mode")) for r in llama if r["tool"] == "llama-bench"}),
    }
    if a.json:
        print(json.dumps({"command": "vs_llamacpp", **setup, "rows": table, "runs": runs}))
        return
    print(f"tpr against llama.cpp: {a.config}, {a.threads} threads, {a.keep} of {a.repeat} runs per side "
          f"(tpr {a.tpr_version}, llama.cpp {setup['llamacpp_build_commit']} from llama-cpp-python {a.llamacpp_python})")
    print(f"  CPU {a.cpu}; {a.flags.strip() or 'no AVX2/AVX-512 flags'}; llama.cpp flash attention "
          f"{a.llamacpp_fa or '?'}, KV cache {', '.join(setup['llamacpp_kv_type']) or '?'}")
    if a.tpr_args:
        print(f"  tpr bench model extra flags: {a.tpr_args}")
    print(f"  {'tok/s':<34} {'tpr':>10} {'llama.cpp':>10} {'tpr/llama':>10}   runs (tpr | llama.cpp; * other "
          f"processes used > {100 * a.disturbed:.0f}% of the CPUs, left out of the {a.keep} when quieter runs exist)")
    for e in table:
        fmt = lambda v: f"{v:10.1f}" if v is not None else f"{'-':>10}"
        ratio = f"{e['ratio']:9.2f}x" if e["ratio"] else f"{'-':>10}"
        star = lambda v, o: f"{v:.0f}" + ("*" if o is not None and o > a.disturbed else "")
        runs_txt = (" ".join(map(star, e["tpr_runs"], e["tpr_runs_others_cpu"])) + " | " +
                    " ".join(map(star, e["llamacpp_runs"], e["llamacpp_runs_others_cpu"])))
        print(f"  {e['label'] + ', ' + e['dtype']:<34} {fmt(e['tpr_tok_s'])} {fmt(e['llamacpp_tok_s'])} {ratio}   {runs_txt}")
        if "tpr_roofline_fraction" in e:
            print(f"  {'  tpr decode b1 vs its roofline':<34} {100 * e['tpr_roofline_fraction']:9.1f}%"
                  f" (roofline {e['tpr_roofline_tok_s']:.0f} tok/s from the run's read probe)")
        if "llamacpp_roofline_fraction" in e:
            print(f"  {'  llama.cpp decode b1, same roofline':<34} {100 * e['llamacpp_roofline_fraction']:9.1f}%"
                  f" (against the roofline of the tpr run of the same round)")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("parse-tpr")
    l = sub.add_parser("parse-llama")
    for q in (t, l):
        q.add_argument("--dtype", required=True)
        q.add_argument("--row", required=True, choices=[r for r, _ in ROWS])
        q.add_argument("--rep", type=int, required=True)
    l.add_argument("--tool", required=True, choices=["llama-bench", "llama-batched-bench"])
    l.add_argument("--log", help="the tool's stderr (where batched-bench may print its lines)")
    for q in (t, l):
        q.add_argument("--meter", help="the run's `run --meter` record")
        q.add_argument("--busy-before", type=float, help="the CPUs' busy fraction before the run (wait-idle)")
    w = sub.add_parser("wait-idle")
    w.add_argument("--max-wait", type=float, default=300)
    w.add_argument("--threshold", type=float, default=0.1)
    m = sub.add_parser("run")
    m.add_argument("--meter", required=True)
    m.add_argument("command", nargs=argparse.REMAINDER)
    r = sub.add_parser("report")
    r.add_argument("--results", required=True)
    r.add_argument("--keep", choices=["median", "best"], default="median")
    for k in ("threads", "repeat"):
        r.add_argument(f"--{k}", type=int, required=True)
    r.add_argument("--disturbed", type=float, default=0.1)
    for k in ("config", "cpu", "flags", "tpr-version", "llamacpp-python", "llamacpp-fa", "tpr-args"):
        r.add_argument(f"--{k}", default="")
    r.add_argument("--json", action="store_true")
    a = p.parse_args()
    {"parse-tpr": parse_tpr, "parse-llama": parse_llama, "report": report, "wait-idle": wait_idle,
     "run": run_metered}[a.cmd](a)


if __name__ == "__main__":
    main()
