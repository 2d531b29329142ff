set -u
D=.dev7 W=/tmp/w C=.dev7/ctune
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
echo "== test_generate"; $D/test_generate
mkdir -p $W
$C init --config configs/models/tiny/config.json --out $W/tiny --seed 1 >/dev/null
echo "== train tiny on cuda"
$C train configs/tiny.yaml --set device=cuda --set model=$W/tiny --set output_dir=$W/run --set training.max_steps=60 \
  --set training.eval_steps=30 --set training.save_steps=30 --set training.logging_steps=10 2>&1 | tail -6
grep -m1 memory_gib $W/run/metrics.jsonl; cp $W/run/loss.svg $W/run/metrics.jsonl $OUT/
echo "== merge + eval (cuda)"
$C merge --model $W/tiny --adapter $W/run/final --out $W/merged
E="configs/tiny.yaml --set device=cuda --set output_dir=$W/x"
$C eval $E --set model=$W/tiny; $C eval $E --set model=$W/tiny --adapter $W/run/final; $C eval $E --set model=$W/merged
$C eval configs/tiny.yaml --set device=cpu --set output_dir=$W/x --set model=$W/merged
python3 $D/hf_check.py $W 2>&1 | grep -v Warning | tail -3
echo "== generate"
for d in cuda cpu; do $C generate --model $W/tiny --adapter $W/run/final --prompt "What is 12 plus 30?" --device $d; done
$C generate --model $W/merged --prompt "What is 12 plus 30?" --device cuda
$C generate --model $W/merged --prompt "What is 12 plus 30?" --device cuda --temperature 0.8 --top-p 0.9 --seed 3
echo "== qwen3-0.6b shape"
$C init --config configs/models/qwen3-0.6b/config.json --out $W/q06 >/dev/null
python3 -c "print(','.join(str(i*7919%151936) for i in range(512)))" > $W/p.txt
$C generate --model $W/q06 --prompt-file $W/p.txt --max-new-tokens 256 --device cuda --ids >/dev/null
$C generate --model $W/q06 --prompt-ids 1,2,3 --max-new-tokens 256 --device cuda --ids >/dev/null
