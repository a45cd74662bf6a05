"""fairseq 0.12.2's Trainer on the batches benchmarks/fairseq_curve.py wrote: the reference
curve of that comparison. Run with a Python that has torch and fairseq 0.12.2
(docs/notes/benchmarks-lab-notebook.md):

    /tmp/fsenv/bin/python -m benchmarks.fairseq_curve_reference --batches /tmp/curve/batches.npz \
        --out /tmp/curve/fairseq.npz --lr 2e-3 --warmup_updates 100 --clip_norm 10

The model is tests/fixtures/make_fairseq_training_fixture.py's tiny s2t_transformer (random in
every parameter, dropout 0) on the batches' fbank channels and vocabulary; the recipe is
fairseq's MuST-C one (label smoothing 0.1, Adam (0.9, 0.999) eps 1e-8, inverse_sqrt) with the
given learning rate, warm-up and clip-norm, one batch per update. Writes the model's flags,
its initial weights and, per update, the learning rate, loss, nll, sample size and gradient
norm.
"""

import argparse
import tempfile
import time

import numpy as np

from tests.fixtures import make_fairseq_training_fixture as fixture



def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
  parser.add_argument("--batches", required=True)
  parser.add_argument("--out", required=True)
  parser.add_argument("--lr", type=float, required=True)
  parser.add_argument("--warmup_updates", type=int, required=True)
  parser.add_argument("--clip_norm", type=float, required=True)
  args = parser.parse_args()
  recipe = ["--warmup-updates", str(args.warmup_updates), "--clip-norm", str(args.clip_norm),
            "--update-freq", "1"]
  data = np.load(args.batches)
  count = int(data["count"])
  batches = [{key: data[f"batch_{i}/{key}"] for key in ("features", "lengths", "target", "prev")}
             for i in range(count)]
  features = batches[0]["features"].shape[-1]
  fixture.torch.manual_seed(0)
  out = {"model_args": fixture.json.dumps(fixture.MODEL_ARGS)}
  with tempfile.TemporaryDirectory() as tmp:
    cfg, task, model, criterion = fixture.build(tmp, int(data["vocab"]), args.lr, recipe,
                                                features)
    fixture.randomise(model, fixture.torch.Generator().manual_seed(0))
    out.update({f"init/{k}": v for k, v in fixture.state_arrays(model).items()})
    start = time.time()
    fixture.train("curve", cfg, task, model, criterion, batches, [[i] for i in range(count)], out)
    out["seconds"] = time.time() - start
  out = {k: v for k, v in out.items() if not k.startswith("curve/batch_")}
  np.savez(args.out, **out)
  print(f"wrote {args.out}: {count} updates in {out['seconds']:.1f} s")


if __name__ == "__main__":
  main()
