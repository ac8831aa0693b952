#!/usr/bin/env bash
# Every GPU check and benchmark in one go (CUDA machine): the GPU tests, the attention and render
# benchmarks, a short bf16 training of both models on the demo scene (quick preset), and the first
# steps of the GPU default preset (`standard`) on fern. Results go to $1.
#   bash scripts/gpu_checks.sh OUT_DIR [PARTS]   PARTS: any of tests,attention,render,train,standard (default: all)
set -uo pipefail
out=${1:?usage: gpu_checks.sh OUT_DIR [PARTS]}
parts=${2:-tests,attention,render,train,standard}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
has() { [[ ",$parts," == *",$1,"* ]]; }
limit=${PART_TIMEOUT:-300}  # seconds per part
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$out/gpu.txt"
if has tests; then
  timeout $limit python -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | tail -15 | tee "$out/gpu_tests.txt"
fi
if has attention; then
  timeout $limit python scripts/bench_attention.py --device cuda --out "$out/bench_attention_cuda.json" \
    --lengths 1024 4096 16384 65536 131072 200000 --dtype bf16 2>&1 | tail -40 | tee "$out/bench_attention_cuda.txt"
fi
if has render; then
  timeout $limit python scripts/bench_render.py --device cuda --rays 1024 --samples 64 192 --bf16 \
    --out "$out/bench_render_cuda.json" 2>&1 | tail -20 | tee "$out/bench_render_cuda.txt"
fi
if has train; then
  for model in gnt pola_gnt; do
    start=$SECONDS
    timeout $limit python -m pola_gnt.train model=$model trainer=gpu experiment=quick \
      trainer.max_steps=${GPU_TRAIN_STEPS:-600} render.chunk_rays=16384 output.save_images=false hydra.run.dir="$out/train_$model" \
      2>&1 | grep -v "it/s" | tail -12 | tee "$out/train_$model.txt"
    echo "$model: $((SECONDS - start)) s including start-up and test rendering" | tee -a "$out/train_$model.txt"
  done
fi
if has standard; then
  # The GPU default (experiment=standard, conf/experiment/standard.yaml): steps/s and validation PSNR
  # of the first STANDARD_STEPS steps on fern; standard.yaml's one-hour estimate is 16000 steps at ~0.2 s.
  steps=${STANDARD_STEPS:-400}
  for model in gnt pola_gnt; do
    start=$SECONDS
    timeout $((limit * 2)) python -m pola_gnt.train model=$model scene=fern trainer.max_steps=$steps \
      trainer.val_check_interval=$((steps / 2)) output.save_images=false hydra.run.dir="$out/standard_$model" \
      2>&1 | grep -v "it/s" | tail -12 | tee "$out/standard_$model.txt"
    echo "$model: $((SECONDS - start)) s for $steps standard steps including start-up and test rendering" \
      | tee -a "$out/standard_$model.txt"
    python - "$out/standard_$model" <<'PY' | tee -a "$out/standard_$model.txt"
import csv, sys
rows = list(csv.DictReader(open(f"{sys.argv[1]}/csv/metrics.csv")))
print("val/psnr:", [(r["step"], r["val/psnr"]) for r in rows if r.get("val/psnr")])
PY
  done
fi
