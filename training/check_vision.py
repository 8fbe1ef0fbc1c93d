"""Check training/moonvit_torch.py against tests/fixtures/k3-vision-tiny.

  /usr/bin/python3 training/check_vision.py [--fixture DIR] [--tol 1e-4]

1. The tower + projector with the fixture's bf16 weights, fed the reference processor's
   pixel_values, in float64 and float32: max abs error of the projector rows against
   caseK.image_rows.f32 (the C++ gets 2.5e-6 in fp32). Grids come from the PNG sizes through
   plan_resize (red_blue 10x10, gradient 10 rows x 14 columns); the transposed grid is run
   too, as a control that must fail.
2. make_pixel_values() of the red_blue PNG (decoded here) against the reference's
   images/red_blue.pixel_values.f32 (must be exact).
3. Batched == per-image, gradients reach every parameter, and (torch >= 2) the SDPA path
   matches the explicit softmax.
Exits non-zero on any failure.
"""

import argparse
import json
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import moonvit_torch as mv  # noqa: E402


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    w, h = struct.unpack(">II", head[16:24])
    return w, h


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixture", default=os.path.join(here, "..", "tests", "fixtures", "k3-vision-tiny"))
    ap.add_argument("--tol", type=float, default=1e-4)
    args = ap.parse_args()
    fx = args.fixture
    torch.manual_seed(0)
    failures = []

    def check(name, err, tol):
        ok = err <= tol
        print("%-52s max abs err %.3e  (tol %.0e)  %s" % (name, err, tol, "ok" if ok else "FAIL"))
        if not ok:
            failures.append(name)

    cfg = json.load(open(os.path.join(fx, "config.json")))
    proc = json.load(open(os.path.join(fx, "preprocessor_config.json")))
    expected = json.load(open(os.path.join(fx, "vision_expected.json")))
    tensors = mv.read_safetensors(os.path.join(fx, "model.safetensors"))
    text_hidden = cfg["text_config"]["hidden_size"]

    def build(dtype):
        m = mv.VisionTower(cfg["vision_config"], torch_dtype=cfg.get("torch_dtype", "bfloat16"),
                           text_hidden_size=text_hidden)
        m.load_checkpoint_tensors(tensors)
        return m.to(dtype).eval()

    # The images: the reference's pixel values and the grid each one's size gives.
    images = {}
    for fn in sorted(os.listdir(os.path.join(fx, "images"))):
        if not fn.endswith(".png"):
            continue
        w, h = png_size(os.path.join(fx, "images", fn))
        plan = mv.plan_resize(w, h, proc)
        pv = np.fromfile(os.path.join(fx, "images", fn.replace(".png", ".pixel_values.f32")), dtype="<f4")
        p = plan["grid_h"] * plan["grid_w"]
        assert pv.size == p * 3 * 14 * 14, (fn, pv.size, plan)
        images["images/" + fn] = (torch.from_numpy(pv.reshape(p, 3, 14, 14).copy()), (plan["grid_h"], plan["grid_w"]))
        print("%s: %dx%d px -> grid %d rows x %d cols, %d tokens" % (fn, w, h, plan["grid_h"], plan["grid_w"],
                                                                     plan["num_tokens"]))

    # 1. The projector rows.
    for dtype, label in ((torch.float64, "fp64"), (torch.float32, "fp32")):
        m = build(dtype)
        for transpose in (False, True):
            worst = 0.0
            for k, case in enumerate(expected["cases"]):
                want = np.fromfile(os.path.join(fx, case["image_rows_file"]), dtype="<f4").reshape(case["image_rows_shape"])
                pvs = [images[n][0].to(dtype) for n in case["images"]]
                grids = [images[n][1][::-1] if transpose else images[n][1] for n in case["images"]]
                with torch.no_grad():
                    got = m.encode(pvs, grids).double().numpy()
                assert [m.num_tokens(g) for g in grids] == case["image_tokens"]
                err = float(np.abs(got - want).max()) if got.shape == want.shape else float("inf")
                if not transpose:
                    check("case%d image rows %s" % (k, label), err, args.tol)
                worst = max(worst, err)
            if transpose:
                ok = worst > 100 * args.tol
                print("%-52s max abs err %.3e  (must be large)  %s" % ("control: grids transposed, " + label, worst,
                                                                        "ok" if ok else "FAIL"))
                if not ok:
                    failures.append("transposed-grid control " + label)

    # 2. Preprocessing of red_blue.png.
    rgb = mv.decode_png(os.path.join(fx, "images", "red_blue.png"))
    built = np.zeros((128, 128, 3), dtype=np.uint8)
    built[:, :64, 0] = 255
    built[:, 64:, 2] = 255
    print("red_blue.png decoded %s; equals the constructed left-red/right-blue image: %s"
          % (rgb.shape, bool(np.array_equal(rgb, built))))
    if not np.array_equal(rgb, built):
        failures.append("red_blue.png decode")
    pv_ref, grid_ref = images["images/red_blue.png"]
    for src, name in ((rgb, "decoded"), (built, "constructed")):
        pv, grid = mv.make_pixel_values(src, proc)
        err = float((pv - pv_ref).abs().max()) if pv.shape == pv_ref.shape and grid == grid_ref else float("inf")
        check("make_pixel_values(red_blue %s) vs reference" % name, err, 0.0)
    pvb, gb = mv.make_pixel_values(np.stack([built, built[:, ::-1]]), proc)
    check("make_pixel_values batched [2, H, W, 3]", float((pvb[0] - pv_ref).abs().max()), 0.0)

    # 3. Batching, gradients, SDPA.
    m = build(torch.float32)
    pvs = [images["images/red_blue.png"][0], pvb[1], images["images/gradient.png"][0], pv_ref * 0.5]
    grids = [(10, 10), gb, images["images/gradient.png"][1], (10, 10)]
    with torch.no_grad():
        batched = m.forward_images(pvs, grids)
        single = [m(p, g) for p, g in zip(pvs, grids)]
    check("forward_images (grouped) vs one at a time, fp32",
          max(float((a - b).abs().max()) for a, b in zip(batched, single)), 1e-5)
    if mv._HAS_SDPA:
        m.set_sdpa(False)
        with torch.no_grad():
            manual = m.forward_images(pvs, grids)
        m.set_sdpa(True)
        check("SDPA vs explicit softmax, fp32", max(float((a - b).abs().max()) for a, b in zip(batched, manual)), 1e-5)
    m.train()
    m.zero_grad()
    loss = sum((r ** 2).mean() for r in m.forward_images(pvs, grids))
    loss.backward()
    no_grad = [n for n, p in m.named_parameters() if p.grad is None or float(p.grad.abs().max()) == 0.0]
    print("gradients reach all %d parameters: %s" % (len(list(m.parameters())), "ok" if not no_grad else no_grad))
    if no_grad:
        failures.append("gradients")

    # init_weights + the names the checkpoint needs.
    fresh = mv.VisionTower(cfg["vision_config"], text_hidden_size=text_hidden).init_weights(1234)
    names = fresh.checkpoint_tensors()
    same = set(names) == set(tensors) and all(tuple(names[k].shape) == tuple(tensors[k].shape) for k in names)
    print("state_dict names/shapes == checkpoint's vision tensors (%d): %s" % (len(names), "ok" if same else "FAIL"))
    if not same:
        failures.append("names")
    with torch.no_grad():
        r = fresh(pv_ref, (10, 10))
    print("init_weights(1234): rows %s, rms %.3f, finite %s" % (tuple(r.shape), float(r.pow(2).mean().sqrt()),
                                                               bool(torch.isfinite(r).all())))

    if failures:
        print("FAILED:", ", ".join(failures))
        sys.exit(1)
    print("all vision checks passed")


if __name__ == "__main__":
    main()
