"""Evaluation speed against fairseq on equal work: one s2t_transformer_s checkpoint, decoded by
`fairseq-generate` and by this toolkit's `evaluate` (after `import_fairseq`) on the same split
with the same beam, length penalty and maximum length, in alternated rounds; the hypotheses of
the two are compared line by line.

    python -m benchmarks.fairseq_generate --fairseq_python /tmp/torchenv/bin/python \
        --fairseq_root /tmp/fs_main --work /tmp/fairseq_generate \
        --out docs/benchmarks/fairseq_generate.jsonl [--sentences 100] [--rounds 2]

`--fairseq_python` is an interpreter with torch and sentencepiece; `--fairseq_root` a fairseq
checkout (facebookresearch/fairseq, with its Cython extensions built in place and the Python
3.11 patch of tests/fixtures/patch_old_fairseq.py) put on its PYTHONPATH. Neither is needed by
the toolkit.

What is decoded (made in --work on the first run, kept for the next):
- a fairseq data root with one split, tst-COMMON_st.tsv: `--sentences` utterances of random
  80-dim features whose lengths follow MuST-C tst-COMMON's (log-normal, median 500 frames,
  cut to 100..3000), fbank80.zip, config_st.yaml (utterance CMVN) and an 8000-piece
  SentencePiece model with its dictionary (trained on pseudo-words);
- a checkpoint made by fairseq itself (this file, run with --make_checkpoint by
  --fairseq_python): s2t_transformer_s with fairseq's random initialisation, its output
  projection scaled by 8 so that each search step has a clear best token (random logits are
  close together, and a float difference in the last digit could otherwise pick another token
  in one toolkit than in the other). The hypotheses end by EOS or at the maximum length.

Both decode with beam 5, lenpen 1, max length 0 * frames + `--max_len_b`, batches of at most
20000 source frames (fairseq: --max-tokens 20000, sorted by length; here: eval.batch_frames
20000 in buckets). A round runs each command once, from a fresh process, fairseq first in odd
rounds and second in even ones. Reported per command: the whole command's wall time (start-up,
model and data loading, JAX compilation included) and the decoding loop's (fairseq's own
"Translated N sentences in Xs"; here evaluate's decode_s, which includes compiling the search
programs in the first round and loading them from the run's persistent compilation cache,
emptied at the start, in the later ones), with sentences/s of each. The hypotheses are compared with fairseq's in each round,
and once more with fairseq decoding one utterance per batch (fairseq's outputs depend on an
utterance's batch-mates: its subsampler convolves their padding, which this toolkit re-zeroes).
"""

from __future__ import annotations

from benchmarks.report_format import command_line, load, machine_line, markdown_table
import statistics
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile

import numpy as np

VOCAB = 8000
FEATURES = 80
SPLIT = "tst-COMMON"
OUTPUT_SCALE = 8.0
BATCH_FRAMES = 20000


def make_root(root: str, sentences: int, seed: int = 0):
  """The fairseq data root (module docstring)."""
  from data_prep import vocab  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(seed)
  os.makedirs(root)
  letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
  words = ["".join(rng.choice(letters, size=rng.integers(2, 10))) for _ in range(20000)]
  text = [" ".join(rng.choice(words, size=12)) for _ in range(20000)]
  model = vocab.train_sentencepiece(text, os.path.join(root, "spm_unigram8000_st"), VOCAB)
  sp = vocab.Vocabulary(model).sp
  with open(os.path.join(root, "spm_unigram8000_st.txt"), "w", encoding="utf-8") as f:
    f.writelines(f"{sp.id_to_piece(i)} 1\n" for i in range(4, sp.get_piece_size()))
  with open(os.path.join(root, "config_st.yaml"), "w", encoding="utf-8") as f:
    f.write("bpe_tokenizer:\n  bpe: sentencepiece\n  sentencepiece_model: "
            "spm_unigram8000_st.model\ntransforms:\n  '*':\n  - utterance_cmvn\n"
            "vocab_filename: spm_unigram8000_st.txt\ninput_channels: 1\n"
            "input_feat_per_channel: 80\n")
  lengths = np.clip(rng.lognormal(np.log(500), 0.7, size=sentences), 100, 3000).astype(int)
  zip_path = os.path.join(root, "fbank80.zip")
  with zipfile.ZipFile(zip_path, "w", zipfile.ZIP_STORED) as z:
    for i, frames in enumerate(lengths):
      path = os.path.join(root, f"utt_{i}.npy")
      np.save(path, rng.normal(size=(frames, FEATURES)).astype(np.float32))
      z.write(path, arcname=f"utt_{i}.npy")
      os.remove(path)
  with zipfile.ZipFile(zip_path) as z:
    offsets = {i.filename[:-4]: (i.header_offset + 30 + len(i.filename), i.file_size)
               for i in z.infolist()}
  with open(os.path.join(root, f"{SPLIT}_st.tsv"), "w", encoding="utf-8") as f:
    f.write("id\taudio\tn_frames\ttgt_text\tspeaker\tsrc_text\n")
    for i, frames in enumerate(lengths):
      offset, length = offsets[f"utt_{i}"]
      # An absolute path, as fairseq's prep scripts write it (fairseq reads it from the cwd).
      f.write(f"utt_{i}\t{os.path.abspath(zip_path)}:{offset}:{length}\t{frames}\t{text[i]}"
              f"\tspk\t{text[i]}\n")


def make_checkpoint(root: str, path: str):
  """Run by --fairseq_python: fairseq builds s2t_transformer_s for the root's dictionary."""
  import torch  # pylint: disable=import-outside-toplevel,import-error
  from fairseq import options, tasks  # pylint: disable=import-outside-toplevel,import-error
  from fairseq.dataclass.utils import convert_namespace_to_omegaconf  # pylint: disable=all
  torch.manual_seed(0)
  args = options.parse_args_and_arch(options.get_training_parser(), [
      root, "--task", "speech_to_text", "--arch", "s2t_transformer_s", "--config-yaml",
      "config_st.yaml", "--cpu"])
  cfg = convert_namespace_to_omegaconf(args)
  model = tasks.setup_task(cfg.task).build_model(cfg.model)
  with torch.no_grad():
    model.decoder.output_projection.weight.mul_(OUTPUT_SCALE)
  torch.save({"args": args, "model": model.state_dict(), "extra_state": {},
              "optimizer_history": [{"criterion_name": "LabelSmoothedCrossEntropyCriterion",
                                     "optimizer_name": "FairseqAdam",
                                     "lr_scheduler_state": {"best": None},
                                     "num_updates": 0}]}, path)


def fairseq_generate(args, root: str, checkpoint: str, batch_size: int | None = None) -> dict:
  """One fairseq-generate run -> {"wall_s", "loop_s", "hypotheses": {id: text}}.
  --required-batch-size-multiple 1: fairseq's default (8) makes its batch_by_size drop the last
  batch when its size is not a multiple of 8 (since fairseq commit d871f616, after 0.12.3;
  facebookresearch/fairseq#5036), which would leave sentences undecoded."""
  command = [args.fairseq_python, "-m", "fairseq_cli.generate", root, "--config-yaml",
             "config_st.yaml", "--gen-subset", f"{SPLIT}_st", "--task", "speech_to_text",
             "--path", checkpoint, "--max-tokens", str(BATCH_FRAMES), "--beam", str(args.beam),
             "--lenpen", "1", "--max-len-a", "0", "--max-len-b", str(args.max_len_b), "--cpu",
             "--scoring", "sacrebleu", "--required-batch-size-multiple", "1"]
  if batch_size:
    command += ["--batch-size", str(batch_size)]
  env = {**os.environ, "PYTHONPATH": args.fairseq_root}
  start = time.perf_counter()
  done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
  wall = time.perf_counter() - start
  loop = re.search(r"Translated ([\d,]+) sentences .* in ([\d.]+)s", done.stderr + done.stdout)
  if loop is None:
    raise RuntimeError(f"no 'Translated N sentences' line from fairseq-generate:\n"
                       f"{done.stderr[-2000:]}")
  hypotheses = {}
  for line in done.stdout.splitlines():
    if line.startswith("D-"):                      # D-i<TAB>score<TAB>detokenised text
      number, _, text = line[2:].split("\t", 2)
      hypotheses[f"utt_{number}"] = text
  return {"wall_s": wall, "loop_s": float(loop.group(2)), "hypotheses": hypotheses}


def toolkit_evaluate(args, run: str) -> dict:
  """One `python -m multiformer_jax.evaluate` run -> the same fields."""
  command = [sys.executable, "-m", "multiformer_jax.evaluate", "--workdir", run, "--stage",
             "st", "--split", SPLIT, "--checkpoint", "latest", "--beam", str(args.beam),
             "--lenpen", "1"]
  start = time.perf_counter()
  done = subprocess.run(command, capture_output=True, text=True, check=True,
                        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  wall = time.perf_counter() - start
  result = json.loads(done.stdout[done.stdout.index("{"):])
  directory = result["directory"]
  read = lambda name: open(os.path.join(directory, name), encoding="utf-8").read().split("\n")[:-1]
  return {"wall_s": wall, "loop_s": float(result["decode_s"]),
          "hypotheses": dict(zip(read("ids.txt"), read("hyp.txt")))}



# The report's section of this benchmark (benchmarks/report.py assembles them).
def report_section(directory):
  """benchmarks/fairseq_generate.py: evaluate against fairseq-generate on equal work."""
  meta, rows = load(directory, "fairseq_generate.jsonl")
  if not rows:
    return "", []
  timed = [r for r in rows if r["round"] != "alone"]
  alone = next(r for r in rows if r["round"] == "alone")
  table = markdown_table(["round", "command", "sentences", "wall (s)", "sentences/s (wall)",
                  "decoding loop (s)", "sentences/s (loop)", "hypotheses as fairseq's"],
                 [[r["round"], r["command"], r["sentences"], r["wall_s"],
                   r["sentences_per_s_wall"], r["loop_s"], r["sentences_per_s_loop"],
                   r["identical_hypotheses"]] for r in timed])
  ours, theirs = "multiformer_jax.evaluate", "fairseq-generate"
  median = lambda key, keep: statistics.median(r[key] for r in timed if keep(r))
  fairseq = lambda key: median(key, lambda r: r["command"] == theirs)
  cold = lambda key: median(key, lambda r: r["command"] == ours and r["round"] == 1)
  warm = lambda key: median(key, lambda r: r["command"] == ours and r["round"] != 1)
  ratios = {name: (of("sentences_per_s_wall") / fairseq("sentences_per_s_wall"),
                   of("sentences_per_s_loop") / fairseq("sentences_per_s_loop"))
            for name, of in (("cold", cold), ("warm", warm))}
  text = f"""## Evaluation against fairseq-generate

Machine: {machine_line(meta)}, matmul peak {meta['matmul_peak_flops'] / 1e9:.1f} GFLOP/s measured in
the same run. Command: `{command_line(meta['command'])}`. One s2t_transformer_s checkpoint made by
fairseq (facebookresearch/fairseq main at 3d262bb2, torch 2.13.0+cpu, 2 threads; random
weights, output projection x8, vocabulary 8000), imported here; {meta['sentences']} utterances
of random features with MuST-C tst-COMMON's lengths; beam 5, lenpen 1, max length 50 tokens,
batches of at most {meta['batch_frames']} frames; rounds alternate which command runs first.
The loop time is fairseq's own "Translated N sentences in Xs" and evaluate's decode_s, which
includes compiling its search programs in round 1 (cold: the run's compilation cache emptied)
and loading them from that cache in the later rounds (warm).

{table}

evaluate / fairseq-generate, sentences/s (fairseq's median): warm {ratios['warm'][0]:.2f}x over
the whole command, {ratios['warm'][1]:.2f}x in the decoding loop; cold {ratios['cold'][0]:.2f}x
and {ratios['cold'][1]:.2f}x. Batched, fairseq's hypotheses depend on an utterance's
batch-mates (its subsampler convolves their padding; this toolkit's re-zeroes it), so only
some are the same; decoding one utterance per batch (`--batch-size 1`, {alone['wall_s']} s),
fairseq gives evaluate's hypotheses for {alone['identical_hypotheses']} of {alone['sentences']}.
"""
  row = ["evaluate vs fairseq-generate, one imported checkpoint, the same split, beam, length "
         "and batch frames (reported, no target)",
         f"{warm('sentences_per_s_wall'):.2f} sentences/s warm ({ratios['warm'][0]:.2f}x), "
         f"{cold('sentences_per_s_wall'):.2f} cold, fairseq {fairseq('sentences_per_s_wall'):.2f};"
         f" hypotheses as fairseq's one by one: {alone['identical_hypotheses']}/"
         f"{alone['sentences']} ({meta.get('cpu', '?')}, {meta.get('cpu_count', '?')} cores; "
         f"[command and rounds](benchmarks/details.md#evaluation-against-fairseq-generate))",
         "reported"]
  return text, [row]


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--fairseq_python", required=True)
  parser.add_argument("--fairseq_root", required=True)
  parser.add_argument("--work", required=True)
  parser.add_argument("--out", default="docs/benchmarks/fairseq_generate.jsonl")
  parser.add_argument("--sentences", type=int, default=100)
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--beam", type=int, default=5)
  parser.add_argument("--max_len_b", type=int, default=50)
  parser.add_argument("--make_checkpoint", nargs=2, metavar=("ROOT", "PATH"),
                      help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.make_checkpoint:
    make_checkpoint(*args.make_checkpoint)
    return

  from benchmarks.common import Results, machine, matmul_peak  # pylint: disable=all
  from multiformer_jax.fairseq_checkpoints import run_writer  # pylint: disable=all
  from multiformer_jax import schema  # pylint: disable=all
  from multiformer_jax.runtime import checkpoints as ckpt_lib  # pylint: disable=all
  root, checkpoint = os.path.join(args.work, "en-de"), os.path.join(args.work, "checkpoint.pt")
  run = os.path.join(args.work, "run")
  if not os.path.exists(root):
    make_root(root, args.sentences)
  if not os.path.exists(checkpoint):
    subprocess.run([args.fairseq_python, os.path.abspath(__file__), "--fairseq_python", "-",
                    "--fairseq_root", "-", "--work", "-", "--make_checkpoint", root,
                    checkpoint], env={**os.environ, "PYTHONPATH": args.fairseq_root},
                   check=True)
  if not os.path.exists(run):
    run_writer.import_run(checkpoint, root, "st", run)
  config = schema.load_config(run)
  with config.unlocked():
    config.eval.max_len_a, config.eval.max_len_b = 0.0, args.max_len_b
    config.eval.batch_frames = BATCH_FRAMES
    # A fresh persistent compilation cache: the first round compiles, the later ones load.
    config.train.compilation_cache = os.path.join(args.work, "jax_cache")
  shutil.rmtree(config.train.compilation_cache, ignore_errors=True)
  ckpt_lib.save_config(run, config)

  peak = matmul_peak()
  rows = []
  for number in range(1, args.rounds + 1):
    order = [("fairseq-generate", lambda: fairseq_generate(args, root, checkpoint)),
             ("multiformer_jax.evaluate", lambda: toolkit_evaluate(args, run))]
    if number % 2 == 0:
      order.reverse()
    outputs = {}
    for name, command in order:
      outputs[name] = command()
      out = outputs[name]
      print(f"round {number} {name}: wall {out['wall_s']:.1f} s, loop {out['loop_s']:.1f} s, "
            f"{len(out['hypotheses'])} hypotheses", flush=True)
    ours, theirs = outputs["multiformer_jax.evaluate"], outputs["fairseq-generate"]
    same = sum(ours["hypotheses"].get(k) == v for k, v in theirs["hypotheses"].items())
    words = np.mean([len(v.split()) for v in theirs["hypotheses"].values()])
    for name, out in outputs.items():
      n = len(out["hypotheses"])
      rows.append({"round": number, "command": name, "sentences": n,
                   "wall_s": round(out["wall_s"], 2), "loop_s": round(out["loop_s"], 2),
                   "sentences_per_s_wall": round(n / out["wall_s"], 2),
                   "sentences_per_s_loop": round(n / out["loop_s"], 2),
                   "identical_hypotheses": same, "mean_hypothesis_words": round(words, 1),
                   "beam": args.beam, "max_len_b": args.max_len_b})
  # fairseq's outputs depend on an utterance's batch-mates (its subsampler convolves padded
  # frames; this toolkit's re-zeroes them, docs/fairseq.md): one utterance per batch, fairseq
  # computes the function this toolkit computes in any batch.
  alone = fairseq_generate(args, root, checkpoint, batch_size=1)
  same_alone = sum(ours["hypotheses"].get(k) == v for k, v in alone["hypotheses"].items())
  print(f"fairseq-generate --batch-size 1: wall {alone['wall_s']:.1f} s, identical to "
        f"evaluate's: {same_alone} of {len(alone['hypotheses'])}", flush=True)
  rows.append({"round": "alone", "command": "fairseq-generate --batch-size 1",
               "sentences": len(alone["hypotheses"]), "wall_s": round(alone["wall_s"], 2),
               "loop_s": round(alone["loop_s"], 2), "identical_hypotheses": same_alone})
  results = Results(args.out, {**machine(), "matmul_peak_flops": peak,
                                "command": " ".join(sys.argv), "sentences": args.sentences,
                                "rounds": args.rounds, "batch_frames": BATCH_FRAMES})
  for row in rows:
    results.add(**row)


if __name__ == "__main__":
  main()
