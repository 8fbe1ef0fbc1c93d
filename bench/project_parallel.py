#!/usr/bin/env python3
"""Full-K3 decode tok/s on a cluster, projected from parts measured on one GPU.

What is measured, and where it comes from:
  - the per-GPU weight bytes by group under TP x EP: `moonrun plan --json` (the loader's own
    shard rules, model/weight_spec.h);
  - the GPU's copy bandwidth and how close moonrun's decode step comes to its bandwidth
    floor at each batch size: `moonrun bench-model` on the K3-width slice
    (bench/results/k3-slice-<gpu>.json: copy_tb_s, decode[].floor_ratio);
  - the number of collectives a decode step issues per layer: the same run's per-op table
    (all_reduce_sum calls / layers).
What is assumed (and printed): the latency of one small all-reduce across nodes (at TP 16 over
two nodes every all-reduce crosses them). Issue #19 replaces it with measured figures.

  step(b) = bytes_per_gpu(b) / (copy bandwidth x floor_ratio(b)) + collectives x latency
  bytes_per_gpu(b) = dense weights of this rank (TP-split groups / TP, replicated groups whole,
                     the embedding table one row per token) + the experts this rank's batch
                     touches (E/EP (1 - (1 - k/E)^b) per MoE layer) + KV rows and KDA state.

The plans side by side (issue #41), from `moonrun plan --pp-size/--split-* --json`'s stages:
today's flat TP over every GPU against TP 8 inside a node x PP across nodes, each with the
LatentMoE projections and the router replicated (as the loader does) or TP-split. Per stage s
of a plan, at m tokens a micro-batch:

  t_s(m)  = bytes_s(m) / (copy bandwidth x floor_ratio(m))
            + sum over its collectives of count x (latency + wire(bytes_per_token x m))
  latency = --inter-node-us / --ethernet-us when the stage's TP group spans nodes, else
            --nvlink-us; wire = NCCL's hierarchical ring: 2(g-1)/g x S / NVLink inside the
            node, then 2(N-1)/N x S / the node's network bandwidth across N nodes (half of
            that for an all-gather)
  hop     = latency + m x hop bytes / the node's network bandwidth, per stage boundary
  batch 1 : step = sum_s t_s(1) + hops (the stages take turns)
  batch B : PP micro-batches of B/PP tokens (PP 1: one of B); each micro-batch's next token
            waits for its last one, so a micro-batch comes round every
            max(sum_s t_s + hops, PP x max_s t_s); tok/s = B / that period.
floor_ratio at a micro-batch size that was not measured: interpolated in log2(batch).

Usage: bench/project_parallel.py --moonrun build/moonrun --measured bench/results/k3-slice-h200.json \
           --plans-json-out bench/results/parallel-plans-projection.json
       bench/project_parallel.py --single-node 8 --gpu H200 --model models/kimi-k2.7-code.config.json \
           --config models/kimi-k2.7-code.config.json --measured bench/results/<K2 slice run>.json
  (one node, TP = EP = 8, every collective over NVLink: issue #40's K2.7 Code figure)
"""
import argparse
import datetime
import json
import math
import subprocess
import sys


def plan(moonrun, gpu, tp, ep, nodes, pp=1, split="", model="kimi-k3"):
    """split: "" (both replicated), "down" (--split-latent-moe-down), "latent" (--split-latent-moe) or "both"
    (and --split-router)."""
    cmd = [moonrun, "plan", "--model", model, "--gpu", gpu, "--tp-size", str(tp), "--ep-size", str(ep),
           "--nnodes", str(nodes), "--json"]
    if pp > 1:
        cmd += ["--pp-size", str(pp)]
    if split in ("latent", "both"):
        cmd += ["--split-latent-moe"]
    if split == "down":
        cmd += ["--split-latent-moe-down"]
    if split == "both":
        cmd += ["--split-router"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if not out.stdout.strip():
        sys.exit(f"moonrun plan failed: {out.stderr.strip()}")
    return json.loads(out.stdout)


def step_bytes(p, cfg, batch, context):
    tp, ep = p["tp"], p["ep"]
    dense = 0.0
    experts_total = 0.0
    for g in p["weights"]["groups"]:
        if g["name"].startswith("vision"):
            continue  # text decode does not read the tower
        if g["shard"] == "EP":
            experts_total += g["bytes"]
        elif g["shard"] == "TP":
            dense += g["bytes"] / tp
        else:
            dense += g["bytes"]
    t = cfg.get("text_config", cfg)
    hidden, vocab = t["hidden_size"], t["vocab_size"]
    dense -= vocab * hidden * 2 / tp  # the embedding table: one row per token, not the table
    E, k = t["num_experts"], t["num_experts_per_token"]
    moe_layers = t["num_hidden_layers"] - t.get("first_k_dense_replace", 0)
    per_expert = experts_total / (E * moe_layers)
    touched = (E / ep) * (1 - (1 - k / E) ** batch)
    experts = moe_layers * touched * per_expert
    kv = batch * context * p["cache"]["kv_bytes_per_token"]
    state = 2 * batch * p["cache"]["kda_state_per_gpu_bytes_per_sequence"]
    return dense, experts, kv, state


def floor_ratio(ratio, m):
    """The measured share of the bandwidth floor at m tokens; log2-interpolated between
    the measured batch sizes, clamped at the ends."""
    bs = sorted(ratio)
    if m <= bs[0]:
        return ratio[bs[0]]
    if m >= bs[-1]:
        return ratio[bs[-1]]
    for lo, hi in zip(bs, bs[1:]):
        if lo <= m <= hi:
            f = (math.log2(m) - math.log2(lo)) / (math.log2(hi) - math.log2(lo))
            return ratio[lo] + f * (ratio[hi] - ratio[lo])


def routed_experts(t):
    """(experts, experts a token) under K3's names or DeepSeek-V3's (K2)."""
    return t.get("num_experts", t.get("n_routed_experts")), t.get("num_experts_per_token", t.get("num_experts_per_tok"))


def stage_bytes(st, p, cfg, m, context):
    """One GPU of stage `st` in a step of m tokens: its weights (the experts m tokens touch,
    one embedding row a token), its MLA rows and KDA state (read and written)."""
    t = cfg.get("text_config", cfg)
    E, k = routed_experts(t)
    dense = experts = 0.0
    for g in st["groups"]:
        if g["name"].startswith("vision"):
            continue  # text decode does not read the tower
        if g["shard"] == "EP":
            experts += g["per_gpu_bytes"]  # every expert of this GPU's group, whole layers
        else:
            dense += g["per_gpu_bytes"]
    if st["embedding"]:
        dense -= t["vocab_size"] * t["hidden_size"] * 2 / p["tp"]  # one row a token, not the table
    experts *= 1 - (1 - k / E) ** m
    kv = m * context * st["kv_bytes_per_token"]
    state = 2 * m * st["kda_state_per_gpu_bytes_per_sequence"]
    return dense + experts + kv + state


def wire_s(nbytes, all_gather, ranks, gpn, cross, a, net_gb_s):
    """Seconds one collective's bytes take on the wire (NCCL's hierarchical ring)."""
    f = 1.0 if all_gather else 2.0
    inside = min(ranks, gpn)
    t = f * (inside - 1) / inside * nbytes / (a.nvlink_gb_s * 1e9) if inside > 1 else 0.0
    if cross:
        n = ranks // gpn
        t += f * (n - 1) / n * nbytes / (net_gb_s * 1e9)
    return t


def project_plan(p, cfg, batch, context, bw, ratio, a, cross_us, net_gb_s):
    pp, gpn = p["pp"], p["gpus_per_node"]
    stages = p["pipeline"]["stages"]
    m = max(1, batch // pp) if batch > 1 else 1
    micro = batch // m
    kern, coll, t_stage = [], [], []
    for st in stages:
        kms = stage_bytes(st, p, cfg, m, context) / (bw * floor_ratio(ratio, m)) * 1e3
        lat = cross_us if st["collectives_cross_nodes"] else a.nvlink_us
        cms = 0.0
        for c in st["collectives"]:
            w = wire_s(c["bytes_per_token"] * m, c["kind"] == "all_gather", p["tp"], gpn,
                       st["collectives_cross_nodes"], a, net_gb_s)
            # What the L2 prefetch beside a collective took off the step (measured with
            # stand-in collectives, --standin-runs), at most the collective's own latency.
            cms += c["count"] * (max(0.0, lat - a.prefetch_hidden_us) * 1e-3 + w * 1e3)
        kern.append(kms)
        coll.append(cms)
        t_stage.append(kms + cms)
    hop_ms = 0.0
    for h in p["pipeline"]["hops"]:
        lat = cross_us if h["cross_node"] else a.nvlink_us
        hop_ms += lat * 1e-3 + m * h["bytes_per_token"] / ((net_gb_s if h["cross_node"] else a.nvlink_gb_s) * 1e9) * 1e3
    period = max(sum(t_stage) + hop_ms, micro * max(t_stage))
    return {"micro_batches": micro, "micro_batch_tokens": m, "kernel_ms": sum(kern), "collective_ms": sum(coll),
            "hop_ms": hop_ms, "stage_ms": t_stage, "period_ms": period,
            "tok_s_per_sequence": 1e3 / period, "tok_s": batch * 1e3 / period}


def prefetch_hidden_us_from(paths):
    """What the L2 prefetch beside a collective hides, measured on one GPU with stand-in
    collectives (`moonrun bench-model --tp-size N --standin-collective-us U`): three runs of
    rank 0 alone - collectives waiting 0 us, U us, and U us with MOONRUN_L2_PREFETCH_MB set.
    Batch 1: the waits add (t_U - t_0), i.e. n = (t_U - t_0) / U collectives' worth; the
    prefetch takes (t_U - t_pf) off; per collective (t_U - t_pf) / n."""
    runs = [json.load(open(p)) for p in paths]
    us = [r.get("standin_collective_us", -1) for r in runs]
    if us[0] != 0 or us[1] <= 0 or us[2] != us[1]:
        sys.exit(f"--standin-runs: stand-in latencies {us}: need 0, U and U (the third with the prefetch on)")
    step = [next(d["step_ms"] for d in r["decode"] if d["batch"] == 1) for r in runs]
    n = (step[1] - step[0]) * 1e3 / us[1]
    if n <= 0:
        sys.exit(f"--standin-runs: the waits added nothing ({step[0]:.3f} -> {step[1]:.3f} ms)")
    hidden = max(0.0, (step[1] - step[2]) * 1e3 / n)
    return hidden, (f"measured on one {runs[0].get('gpu', 'GPU')}: rank 0 of TP {runs[0].get('tp_size')} with stand-in "
                    f"collectives, batch 1 step {step[0]:.3f} / {step[1]:.3f} / {step[2]:.3f} ms (0 us / {us[1]:g} us / "
                    f"{us[1]:g} us + L2 prefetch): {n:.0f} collectives' worth of waits, {hidden:.2f} us hidden a "
                    f"collective; {', '.join(paths)}")


def nvlink_us_from(path):
    """The latency of one small all-reduce inside a node, measured: a `moonrun bench-model
    --tp-size N --json-out` run on N GPUs of one node, whose collectives bench times the
    forward's all-reduces over NCCL (captured in CUDA graphs, as decode steps issue them).
    Takes the mean of those of the fewest rows (batch 1's), the case the projection's batch-1
    rows rest on."""
    j = json.load(open(path))
    c = j.get("collectives")
    if not c:
        sys.exit(f"{path}: no collectives figures (a bench-model run with --tp-size >= 2)")
    if c.get("transport") != "nccl":
        sys.exit(f"{path}: collectives timed over {c.get('transport')!r}, not NCCL: not an NVLink latency")
    if not c.get("sums_checked"):
        sys.exit(f"{path}: the collectives bench did not check its sums")
    figs = [f for f in c["figures"] if f["op"] == "all_reduce_sum" and f["captured"]] or \
           [f for f in c["figures"] if f["op"] == "all_reduce_sum"]
    if not figs:
        sys.exit(f"{path}: no all-reduce figures")
    fewest = min(f["rows"] for f in figs)
    pick = [f["us"] for f in figs if f["rows"] == fewest]
    us = sum(pick) / len(pick)
    return us, (f"measured: mean of {len(pick)} all-reduce(s) of {fewest} row(s) over {c['world']} GPUs "
                f"({'captured' if figs[0]['captured'] else 'eager'}), {path}")


def plans_table(a, cfg, measured, copy, ratio):
    """Today's flat TP against TP 8 x PP, with and without the split projections/router."""
    clusters = [
        ("16 x H200 (2 nodes, NVLink + InfiniBand)", "H200", 16, 2, copy, a.inter_node_us, a.ib_node_gb_s),
        ("32 x H100 (4 nodes, TCP Ethernet: the seed)", "H100", 32, 4, copy * 3.35 / 4.8, a.ethernet_us,
         a.ethernet_node_gb_s),
    ]
    batches = [int(b) for b in a.plan_batches.split(",")]
    print(f"\n## The plans side by side (issue #41): projection, not a measurement\n")
    print(f"Assumed (all parameters of this script): across nodes {a.inter_node_us} us a collective over InfiniBand "
          f"at {a.ib_node_gb_s} GB/s a node, {a.ethernet_us} us over TCP Ethernet at {a.ethernet_node_gb_s} GB/s a "
          f"node; inside a node {a.nvlink_us:.2f} us a collective ({a.nvlink_source}) at {a.nvlink_gb_s} GB/s a GPU "
          f"over NVLink. "
          f"Measured: copy bandwidth {measured['copy_tb_s']:.2f} TB/s (H100: x 3.35/4.8), floor shares "
          + ", ".join(f"b={b} {ratio[b]:.2f}" for b in sorted(ratio)) + f"; {a.context} tokens of context.\n")
    print("| cluster | plan | GB a GPU (busiest stage) | collectives a step (across nodes) | hops | batch | "
          "kernels (ms) | collectives (ms) | hops (ms) | token period (ms) | tok/s a sequence | tok/s total | vs today |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows = []
    for name, gpu, gpus, nodes, bw, cross_us, net in clusters:
        # The router's split costs an all-gather a MoE layer for 0.5 GB a GPU at TP 8: the
        # LatentMoE split alone is the row to read (docs/performance.md).
        plans = [("TP%d (today)" % gpus, gpus, 1, ""), ("TP%d + split LatentMoE/router" % gpus, gpus, 1, "both"),
                 ("TP8 x PP%d" % (gpus // 8), 8, gpus // 8, ""),
                 ("TP8 x PP%d + split LatentMoE down" % (gpus // 8), 8, gpus // 8, "down"),
                 ("TP8 x PP%d + split LatentMoE" % (gpus // 8), 8, gpus // 8, "latent"),
                 ("TP8 x PP%d + split LatentMoE/router" % (gpus // 8), 8, gpus // 8, "both")]
        today = {}
        for label, tp, pp, split in plans:
            p = plan(a.moonrun, gpu, tp, tp, nodes, pp, split)
            pl = p["pipeline"]
            for b in batches:
                r = project_plan(p, cfg, b, a.context, bw, ratio, a, cross_us, net)
                if pp == 1 and not split:
                    today[b] = r["tok_s"]
                r.update({"cluster": name, "gpu": gpu, "plan": label, "tp": tp, "ep": tp, "pp": pp,
                          "split_latent_moe": split in ("down", "latent", "both"),
                          "split_latent_up": split in ("latent", "both"), "split_router": split == "both",
                          "batch": b,
                          "weights_per_gpu_bytes": pl["max_stage_per_gpu_bytes"],
                          "collectives_per_step": pl["collectives_per_step"],
                          "cross_node_collectives_per_step": pl["cross_node_collectives_per_step"],
                          "hops_per_step": len(pl["hops"]),
                          "latent_moe_split_saves_per_gpu_bytes": pl["latent_moe_split_saves_per_gpu_bytes"],
                          "router_split_saves_per_gpu_bytes": pl["router_split_saves_per_gpu_bytes"],
                          "vs_today": r["tok_s"] / today[b]})
                rows.append(r)
                print(f"| {name} | {label} | {pl['max_stage_per_gpu_bytes'] / 1e9:.2f} | "
                      f"{pl['collectives_per_step']} ({pl['cross_node_collectives_per_step']}) | {len(pl['hops'])} | "
                      f"{b} | {r['kernel_ms']:.2f} | {r['collective_ms']:.2f} | {r['hop_ms']:.2f} | "
                      f"{r['period_ms']:.2f} | {r['tok_s_per_sequence']:.1f} | {r['tok_s']:,.0f} | "
                      f"{r['vs_today']:.2f} |")
    # What each split saves a GPU per step, at TP 8 (a stage of TP8 x PP2) and at TP 16.
    print()
    for tp, pp in ((8, 2), (16, 1)):
        p = plan(a.moonrun, "H200", tp, tp, 2, pp, "")["pipeline"]
        print(f"TP {tp} x PP {pp}: splitting saves a GPU each step {p['latent_moe_split_saves_per_gpu_bytes'] / 1e9:.2f} GB "
              f"(LatentMoE projections) and {p['router_split_saves_per_gpu_bytes'] / 1e9:.2f} GB (router), "
              f"= {p['latent_moe_split_saves_per_gpu_bytes'] / (copy * ratio[1]) * 1e3:.2f} and "
              f"{p['router_split_saves_per_gpu_bytes'] / (copy * ratio[1]) * 1e3:.2f} ms at the b=1 H200 rate")
    return rows


def single_node(a, cfg, measured, copy, ratio):
    """One node, TP = EP = its GPUs (issue #40: Kimi K2.7 Code on 8 x H200): every collective
    inside the node; the floor shares are those measured on the model's own slice."""
    batches = sorted(ratio)
    print(f"{a.model} on {a.single_node} x {a.gpu} (one node, TP {a.single_node} x EP {a.single_node}), projected from "
          f"{a.measured} (commit {measured.get('commit', '?')}, {measured.get('gpu', '?')}): copy bandwidth "
          f"{copy / 1e12:.2f} TB/s, floor shares " + ", ".join(f"b={b} {ratio[b]:.2f}" for b in batches)
          + f"; {a.context} tokens of context; {a.nvlink_us:.2f} us a collective ({a.nvlink_source}) at {a.nvlink_gb_s} GB/s over "
          "NVLink. A projection, not a measurement.\n")
    p = plan(a.moonrun, a.gpu, a.single_node, a.single_node, 1, model=a.model)
    pl = p["pipeline"]
    print("| cluster | batch | GB a GPU (weights) | collectives a step | kernels (ms) | collectives (ms) | step (ms) | "
          "tok/s a sequence | tok/s total |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows = []
    name = f"{a.single_node} x {a.gpu} (one node)"
    for b in batches:
        r = project_plan(p, cfg, b, a.context, copy, ratio, a, a.nvlink_us, a.nvlink_gb_s)
        r.update({"cluster": name, "model": a.model, "tp": a.single_node, "ep": a.single_node, "batch": b,
                  "weights_per_gpu_bytes": pl["max_stage_per_gpu_bytes"],
                  "collectives_per_step": pl["collectives_per_step"], "floor_ratio_used": ratio[b]})
        rows.append(r)
        print(f"| {name} | {b} | {pl['max_stage_per_gpu_bytes'] / 1e9:.2f} | {pl['collectives_per_step']} | "
              f"{r['kernel_ms']:.2f} | {r['collective_ms']:.2f} | {r['period_ms']:.2f} | "
              f"{r['tok_s_per_sequence']:.1f} | {r['tok_s']:,.0f} |")
    if a.json_out:
        json.dump({"what": "projection, not a measurement", "date": datetime.date.today().isoformat(),
                   "model": a.model, "source": a.measured, "commit": measured.get("commit"),
                   "gpu_measured": measured.get("gpu"), "context_tokens": a.context,
                   "copy_tb_s_measured": measured["copy_tb_s"], "copy_tb_s_used": copy / 1e12, "floor_ratio": ratio,
                   "assumed": {"nvlink_us": a.nvlink_us, "nvlink_us_source": a.nvlink_source,
                               "nvlink_gb_s": a.nvlink_gb_s, "prefetch_hidden_us": a.prefetch_hidden_us,
                               "prefetch_hidden_source": a.prefetch_source}, "rows": rows},
                  open(a.json_out, "w"), indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--moonrun", default="build/moonrun")
    ap.add_argument("--measured", default="bench/results/k3-slice-h200.json")
    ap.add_argument("--config", default="../shared/models/kimi-k3.config.json")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--inter-node-us", type=float, default=40.0,
                    help="assumed: one small all-reduce across nodes over InfiniBand")
    ap.add_argument("--ethernet-us", type=float, default=250.0,
                    help="assumed: one small all-reduce across nodes over TCP Ethernet (the seed's cluster)")
    ap.add_argument("--nvlink-us", type=float, default=10.0,
                    help="assumed: one small collective inside a node over NVLink (NCCL, 8 GPUs)")
    ap.add_argument("--measured-collectives", default="", metavar="JSON",
                    help="a `moonrun bench-model --tp-size N --json-out` run on N GPUs of one node: its NCCL "
                         "all-reduces of batch 1 replace --nvlink-us")
    ap.add_argument("--standin-runs", nargs=3, default=None, metavar=("ZERO", "U", "U_PREFETCH"),
                    help="three `bench-model --tp-size N --standin-collective-us` runs (0 us, U us, U us with "
                         "MOONRUN_L2_PREFETCH_MB): what the L2 prefetch hides a collective comes off every collective")
    ap.add_argument("--nvlink-gb-s", type=float, default=450.0,
                    help="assumed: NVLink bandwidth a GPU, one direction (H100/H200: 900 GB/s both ways)")
    ap.add_argument("--ib-node-gb-s", type=float, default=400.0,
                    help="assumed: a node's InfiniBand bandwidth (8 x 400 Gb/s NDR)")
    ap.add_argument("--ethernet-node-gb-s", type=float, default=12.5,
                    help="assumed: a node's TCP Ethernet bandwidth (100 GbE, the seed's cluster)")
    ap.add_argument("--plan-batches", default="1,128", help="batch sizes of the plans table")
    ap.add_argument("--json-out", default="")
    ap.add_argument("--plans-json-out", default="", help="the plans table as JSON")
    ap.add_argument("--single-node", type=int, default=0, metavar="GPUS",
                    help="only this: --model on one node of GPUS x --gpu at TP = EP = GPUS (e.g. K2.7 Code on 8 x H200)")
    ap.add_argument("--model", default="kimi-k3", help="what `moonrun plan --model` takes (with --single-node)")
    ap.add_argument("--gpu", default="H200", help="with --single-node")
    a = ap.parse_args()
    a.nvlink_source = "assumed"
    a.prefetch_hidden_us, a.prefetch_source = 0.0, "none"
    if a.standin_runs:
        a.prefetch_hidden_us, a.prefetch_source = prefetch_hidden_us_from(a.standin_runs)
        print(f"(L2 prefetch beside each collective: {a.prefetch_hidden_us:.2f} us off it, {a.prefetch_source})")
    if a.measured_collectives:
        a.nvlink_us, a.nvlink_source = nvlink_us_from(a.measured_collectives)
        print(f"(inside a node: {a.nvlink_us:.2f} us a collective, {a.nvlink_source})")
    measured = json.load(open(a.measured))
    cfg = json.load(open(a.config))
    if a.single_node:
        # A share above 1 means the slice's floor overcounted its bytes (its synthetic router
        # touches fewer experts than a uniform one): taken as 1, the kernels at the floor.
        ratio = {d["batch"]: min(1.0, d["floor_ratio"]) for d in measured["decode"]}
        copy = measured["copy_tb_s"] * 1e12
        if "H100" in measured.get("gpu", "") and a.gpu == "H200":
            copy *= 4.8 / 3.35  # measured on an H100: the H200's at the same share of its nominal bandwidth
            print(f"(copy bandwidth taken as the H100's measured {measured['copy_tb_s']:.2f} TB/s x 4.8 / 3.35 = "
                  f"{copy / 1e12:.2f} TB/s for the H200)")
        single_node(a, cfg, measured, copy, ratio)
        return
    layers = cfg.get("text_config", cfg)["num_hidden_layers"]
    copy = measured["copy_tb_s"] * 1e12
    ratio = {d["batch"]: d["floor_ratio"] for d in measured["decode"]}
    # all-reduces per layer from the measured per-op table (batch 1, three layers in the slice)
    ops = measured["decode"][0]["ops"]
    slice_layers = 3
    per_layer = sum(o["calls"] for o in ops if o["op"] == "all_reduce_sum") / slice_layers
    collectives = per_layer * layers + 1  # + the lm_head's all-gather
    # H100 SXM: 3.35 TB/s nominal, taken at the H200's measured / nominal (4.8 TB/s) ratio.
    clusters = [
        ("16 x H200 (2 nodes, NVLink + InfiniBand)", "H200", 16, 16, 2, copy, a.inter_node_us),
        ("32 x H100 (4 nodes, TCP Ethernet: the seed)", "H100", 32, 32, 4, copy * 3.35 / 4.8, a.ethernet_us),
    ]
    rows = []
    print(f"Full-K3 decode projection from one-GPU measurements ({a.measured}, commit {measured.get('commit', '?')}),")
    print(f"{a.context} tokens of context; {per_layer:.0f} all-reduces a layer x {layers} layers + 1 all-gather = "
          f"{collectives:.0f} collectives a step; assumed latencies (every TP all-reduce spans the nodes): "
          f"{a.inter_node_us} us over InfiniBand, {a.ethernet_us} us over Ethernet.\n")
    print("| cluster | batch | GB a GPU a step | kernels at measured efficiency (ms) | collectives (ms) | step (ms) | tok/s a sequence | tok/s total | vs seed 5.8 tok/s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, gpu, tp, ep, nodes, bw, lat_us in clusters:
        p = plan(a.moonrun, gpu, tp, ep, nodes)
        for b in sorted(ratio):
            dense, experts, kv, state = step_bytes(p, cfg, b, a.context)
            total = dense + experts + kv + state
            kern_ms = total / (bw * ratio[b]) * 1e3
            coll_ms = collectives * lat_us * 1e-3
            step_ms = kern_ms + coll_ms
            row = {"cluster": name, "gpu": gpu, "tp": tp, "ep": ep, "nodes": nodes, "batch": b,
                   "bytes_per_gpu": total, "kernel_ms": kern_ms, "collective_ms": coll_ms, "step_ms": step_ms,
                   "tok_s_per_sequence": 1e3 / step_ms, "tok_s": b * 1e3 / step_ms,
                   "floor_ratio_used": ratio[b], "collective_latency_us_assumed": lat_us}
            rows.append(row)
            print(f"| {name} | {b} | {total / 1e9:.2f} | {kern_ms:.2f} | {coll_ms:.2f} | {step_ms:.2f} | "
                  f"{1e3 / step_ms:.1f} | {b * 1e3 / step_ms:,.0f} | {1e3 / step_ms / 5.8:.1f}x |")
    plan_rows = plans_table(a, cfg, measured, copy, ratio)
    if a.plans_json_out:
        assumed = {k: getattr(a, k) for k in ("inter_node_us", "ethernet_us", "nvlink_us", "nvlink_gb_s",
                                              "ib_node_gb_s", "ethernet_node_gb_s")}
        assumed["nvlink_us_source"] = a.nvlink_source
        assumed["prefetch_hidden_us"], assumed["prefetch_hidden_source"] = a.prefetch_hidden_us, a.prefetch_source
        json.dump({"what": "projection, not a measurement", "date": datetime.date.today().isoformat(),
                   "source": a.measured, "commit": measured.get("commit"), "context_tokens": a.context,
                   "copy_tb_s": measured["copy_tb_s"], "floor_ratio": ratio, "assumed": assumed,
                   "rows": plan_rows}, open(a.plans_json_out, "w"), indent=1)
    if a.json_out:
        json.dump({"source": a.measured, "commit": measured.get("commit"), "context_tokens": a.context,
                   "collectives_per_step": collectives, "assumed_latency_us":
                   {"infiniband": a.inter_node_us, "ethernet": a.ethernet_us},
                   "projection": rows}, open(a.json_out, "w"), indent=1)


if __name__ == "__main__":
    main()
