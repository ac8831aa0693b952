#!/usr/bin/env bash
# The fine-tuning study of docs/pretraining.md: for each seed and model, fine-tuning from the shipped
# checkpoint and per-scene training from scratch, side by side (one core each, started together so
# they share the machine alike), each for 5 minutes of training with the models of 1 and 2 minutes
# saved on the way (trainer.checkpoint_minutes) and scored afterwards; then the report.
#
#   bash scripts/finetune_study.sh OUT_DIR [SEEDS] [MODELS]     # defaults: "0 1 2", "pola_gnt gnt"
#
# Needs fern (data.root or $POLA_GNT_DATA) and the LPIPS weights ($POLA_GNT_LPIPS_WEIGHTS).
set -euo pipefail
out=${1:?usage: bash scripts/finetune_study.sh OUT_DIR [SEEDS] [MODELS]}
seeds=${2:-0 1 2}
models=${3:-pola_gnt gnt}
export OMP_NUM_THREADS=1
common=(scene=fern trainer.max_time=5 trainer.max_steps=100000 "trainer.checkpoint_minutes=[1,2]"
        trainer.val_check_interval=250)
score() {  # score() RUN_DIR MINUTES: eval the model saved at that many minutes of training
  python -m pola_gnt.eval scene=fern ckpt_path="$1/checkpoints/minutes$2.ckpt" output.save_images=false \
    hydra.run.dir="$1/minutes$2" > "$1/minutes$2.log" 2>&1
}
for seed in $seeds; do
  for model in $models; do
    tuned=$out/finetuned/$model/seed$seed
    scratch=$out/scratch/$model/seed$seed
    mkdir -p "$(dirname "$tuned")" "$(dirname "$scratch")"
    python -m pola_gnt.train "${common[@]}" model=$model seed=$seed experiment=finetune \
      init_from=pretrained:$model hydra.run.dir=$tuned > "$tuned.log" 2>&1 &
    python -m pola_gnt.train "${common[@]}" model=$model seed=$seed experiment=quick \
      hydra.run.dir=$scratch > "$scratch.log" 2>&1 &
    wait
    score "$tuned" 2 & score "$scratch" 2 & wait
  done
done
# The 1-minute models last, so a study cut short still has its 2- and 5-minute rows for every seed.
for seed in $seeds; do
  for model in $models; do
    score "$out/finetuned/$model/seed$seed" 1 & score "$out/scratch/$model/seed$seed" 1 & wait
  done
done
python -m pola_gnt.report "$out" --out "$out/report"
