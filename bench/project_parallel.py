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

Usage: bench/project_parallel.py --moonrun build/moonrun --measured bench/results/k3-slice-h200.json
"""
import argparse
import json
import subprocess
import sys


def plan(moonrun, gpu, tp, ep, nodes):
    out = subprocess.run([moonrun, "plan", "--model", "kimi-k3", "--gpu", gpu, "--tp-size", str(tp), "--ep-size",
                          str(ep), "--nnodes", str(nodes), "--json"], capture_output=True, text=True)
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
    ap.add_argument("--json-out", default="")
    a = ap.parse_args()
    measured = json.load(open(a.measured))
    cfg = json.load(open(a.config))
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
    if a.json_out:
        json.dump({"source": a.measured, "commit": measured.get("commit"), "context_tokens": a.context,
                   "collectives_per_step": collectives, "assumed_latency_us":
                   {"infiniband": a.inter_node_us, "ethernet": a.ethernet_us},
                   "projection": rows}, open(a.json_out, "w"), indent=1)


if __name__ == "__main__":
    main()
