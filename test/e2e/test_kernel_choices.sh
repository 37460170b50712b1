# The config section "kernels" (KernelsConfig: a CUDA kernel's other way where a GPU has not yet
# chosen) on the trainer over CudaOps on the CUDA emulator (build/train_gpt_emu), bf16, one head of
# size 64 (both flash ways cover it), 144 tokens (two 128-key tiles, three of 64):
#  - kernels.layernorm_backward=streamed: losses and final weights bitwise the default (rows kept in
#    registers: the same arithmetic in the same order);
#  - kernels.attention_backward=dq_from_ds: one more device allocation in step 1 (its dS scratch),
#    losses within 1% of the default's; =fused likewise (its fp32 dQ accumulators);
#  - kernels.attention_forward=keys128: the softmax rescaled at other tile boundaries, so not
#    bitwise the default (which shows the key reached the forward), losses within 1%;
#  - kernels.attention_forward=wgmma and =wgmma_pipelined, attention_backward=wgmma_dq, =wgmma,
#    =wgmma_pipelined and =wgmma_ss, and with attention_wgmma_layout=mn_major (V, K, Q, dO read as
#    they lie; refused without a wgmma way): bitwise the default here (the emulator's wgmma sums in the mma's order, over
#    the same 64-row tiles; the pipelined kernels add the same products in the same order; test_gpu
#    attention_wgmma checks the kernels themselves);
#  - the CPU backend ignores the section; a bad value is exit 2 naming the key.
source "$(dirname "$0")/lib.sh"
emu_tiny_config "$W/c.json" bf16
run() {  # DIR ARGS...: a device run into $W/DIR
    local d=$1
    shift
    "$EMU" "$W/c.json" device=cuda out.format=llmc model.n_head=1 model.max_seq_len=256 train.seq_len=144 \
        train.micro_batch=1 train.steps=4 "out_dir=$W/$d" "$@" > "$W/$d.txt" 2>&1 || die "$d: $(tail -n 5 "$W/$d.txt")"
}
bitwise() {  # DIR KEY=VALUE...: a run with the keys whose losses and final weights are the default's
    local d=$1
    shift
    run "$d" "${@/#/kernels.}"
    cmp <(losses "$W/auto/log.jsonl") <(losses "$W/$d/log.jsonl") || die "$*: losses differ"
    cmp "$W/auto/model_00000004.bin" "$W/$d/model_00000004.bin" || die "$*: weights differ"
}
run auto
bitwise streamed layernorm_backward=streamed
within() {  # RUN KEY: the run's losses within 1% of the default's
    paste <(losses "$W/auto/log.jsonl") <(losses "$W/$1/log.jsonl") |
        awk -v k="$2" '{ r = ($2 - $1) / $1; if (r < 0) r = -r; if (r > 0.01) { print k ": loss " $2 " against " $1; bad = 1 } }
                       END { exit bad }' || die "$2: losses off by more than 1%"
    echo "  $2: losses $(losses "$W/$1/log.jsonl" | tr '\n' ' ')(default $(losses "$W/auto/log.jsonl" | tr '\n' ' '))"
}
allocs1() { grep -o '"allocs":[0-9]*' "$W/$1/log.jsonl" | head -n 1 | cut -d: -f2; }
# dQ from dS: the dS scratch is one more device allocation in step 1 (the key reached the backward;
# on the emulator its dQ came out bitwise the recomputing kernel's: S, P and dS are the same sums)
run dq_from_ds kernels.attention_backward=dq_from_ds
[ "$(allocs1 dq_from_ds)" = $(( $(allocs1 auto) + 1 )) ] ||
    die "kernels.attention_backward=dq_from_ds: step 1 allocated $(allocs1 dq_from_ds), the default $(allocs1 auto) (no dS scratch?)"
within dq_from_ds kernels.attention_backward=dq_from_ds
# one kernel: its dQ accumulators are one more allocation in step 1; dQ summed in fp32 in another order
run fused kernels.attention_backward=fused
[ "$(allocs1 fused)" = $(( $(allocs1 auto) + 1 )) ] ||
    die "kernels.attention_backward=fused: step 1 allocated $(allocs1 fused), the default $(allocs1 auto) (no accumulators?)"
within fused kernels.attention_backward=fused
# 128-key tiles: the online softmax rescales at other tile boundaries: not bitwise the default
run keys128 kernels.attention_forward=keys128
cmp -s <(losses "$W/auto/log.jsonl") <(losses "$W/keys128/log.jsonl") &&
    cmp -s "$W/auto/model_00000004.bin" "$W/keys128/model_00000004.bin" &&
    die "kernels.attention_forward=keys128: bitwise the default (did the key reach the forward?)"
within keys128 kernels.attention_forward=keys128
bitwise wgmma attention_forward=wgmma
bitwise wgmma_pipe attention_forward=wgmma_pipelined
bitwise wgmma_dq attention_backward=wgmma_dq
bitwise wgmma_bwd attention_backward=wgmma
bitwise wgmma_bwd_pipe attention_backward=wgmma_pipelined
bitwise wgmma_ss attention_backward=wgmma_ss
bitwise wgmma_mn attention_forward=wgmma_pipelined attention_backward=wgmma attention_wgmma_layout=mn_major
bitwise wgmma_dq_mn attention_forward=wgmma attention_backward=wgmma_dq attention_wgmma_layout=mn_major
bitwise wgmma_pipe_mn attention_backward=wgmma_pipelined attention_wgmma_layout=mn_major
expect_fail 2 'kernels.attention_wgmma_layout.*neither is one' "$EMU" "$W/c.json" device=cuda \
    kernels.attention_forward=keys128 kernels.attention_wgmma_layout=mn_major
"$BIN" "$W/c.json" precision=fp32 kernels.attention_backward=dq_from_ds train.steps=2 "out_dir=$W/cpu" > "$W/cpu.txt" 2>&1 ||
    die "the CPU backend refused kernels.*: $(tail -n 3 "$W/cpu.txt")"
expect_fail 2 'kernels.attention_forward.*auto, keys128, wgmma, wgmma_pipelined' "$EMU" "$W/c.json" device=cuda kernels.attention_forward=fast
echo "PASS: kernels.layernorm_backward=streamed, attention_forward=wgmma and =wgmma_pipelined, attention_backward=wgmma_dq, =wgmma, =wgmma_pipelined and =wgmma_ss, and attention_wgmma_layout=mn_major, bitwise the default; dq_from_ds, fused (their scratch) and keys128 within 1%; the CPU ignores them"
