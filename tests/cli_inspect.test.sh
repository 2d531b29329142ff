# cli_inspect.test.sh — what `ctune inspect MODEL_DIR` refuses: weights that
# cannot be read (a link loop, a broken link) and weights that are not finite.
# (Checkpoint verification needs a trained run: tools.test.sh.)
source "$(dirname "$0")/lib.sh"
TINY=$ROOT/configs/models/tiny/config.json

has() {
    grep -qF -- "$2" "$1" && return 0
    echo "expected '$2' in $1:"; cat "$1"; return 1
}

a_weights_link_loop_or_broken_link_is_an_input_error() {
    "$CTUNE" init --config "$TINY" --out m >/dev/null || return 1
    rm m/model.safetensors && ln -s model.safetensors m/model.safetensors || return 1
    expect_exit 2 "$CTUNE" inspect m || return 1
    has err.txt "m/model.safetensors: cannot be read (Too many levels of symbolic links)" || return 1
    rm m/model.safetensors && ln -s elsewhere.safetensors m/model.safetensors || return 1
    expect_exit 2 "$CTUNE" inspect m || return 1
    has err.txt "m/model.safetensors: a broken symbolic link" || return 1
}

# Writes bf16 NaN (0x7fc0) and +Inf (0x7f80) over the first two values of
# tensor $2 in safetensors file $1.
poke_nonfinite() {
    python3 - "$1" "$2" <<'PY'
import json, struct, sys
path, name = sys.argv[1], sys.argv[2]
with open(path, "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    f.seek(8 + n + header[name]["data_offsets"][0])
    f.write(struct.pack("<HH", 0x7fc0, 0x7f80))
PY
}

nonfinite_weights_are_reported_and_exit_2() {
    "$CTUNE" init --config "$TINY" --out m >/dev/null || return 1
    expect_exit 0 "$CTUNE" inspect m || return 1
    has out.txt "weights: ok (38 tensors" || return 1
    poke_nonfinite m/model.safetensors model.layers.1.mlp.down_proj.weight || return 1
    expect_exit 2 "$CTUNE" inspect m || return 1
    has out.txt "weights: 2 non-finite values in model.layers.1.mlp.down_proj.weight" || return 1
    has err.txt "tensor model.layers.1.mlp.down_proj.weight has 2 non-finite values" || return 1
    # loading refuses them too: generate does not print ids decoded from NaN
    expect_exit 2 "$CTUNE" generate --model m --prompt-ids 1,2 --max-new-tokens 2 --device cpu || return 1
    has err.txt "model.layers.1.mlp.down_proj.weight' holds 2 non-finite values" || return 1
}

run_test a_weights_link_loop_or_broken_link_is_an_input_error
if command -v python3 >/dev/null; then
    run_test nonfinite_weights_are_reported_and_exit_2
else
    skip_test nonfinite_weights_are_reported_and_exit_2 "needs python3"
fi
summary
