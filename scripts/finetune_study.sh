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
    for run in $tuned $scratch; do
      for minutes in 1 2; do
        python -m pola_gnt.eval scene=fern ckpt_path=$run/checkpoints/minutes$minutes.ckpt \
          hydra.run.dir=$run/minutes$minutes > "$run/minutes$minutes.log" 2>&1 &
      done
      wait
    done
  done
done
python -m pola_gnt.report "$out" --out "$out/report"
