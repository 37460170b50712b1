#!/usr/bin/env bash
# Planted bugs: builds test_gpu_emu from mutated copies of llmc/cuda (one mutation each) and
# expects every one to be caught: test_gpu's cases for the mutated op fail, abort, or give
# different digests in the two schedules. Prints one line per mutation; exit 1 if any was missed.
# Needs build/emu/test/gpu/test_gpu.o and the emulator's objects (make test-emu builds them);
# CXX, EMU_FLAGS, MPI_LIBS come from the Makefile.
set -u
cd "$(dirname "$0")/../.."
B=${LLMC_BUILD:-build}
: "${CXX:?}" "${EMU_FLAGS:?}"
W=$B/planted
missed=0

# each mutation: name, file, test_gpu filter, the text replaced, its replacement, the dtypes its
# cases run in (default fp32,bf16: fp16 runs the same templates as bf16; the flash kernels run in
# bf16 and fp16 only, so their mutations run bf16 alone), and the schedules in the order tried
# (default forward-lockstep then reverse-warp; a bug that only the late copies show, reverse-warp
# first: the first schedule that fails ends the run, and a whole passing filter costs 6-12 s)
mutate() {
    names+=("$1"); files+=("$2"); filters+=("$3"); olds+=("$4"); news+=("$5"); dtypes+=("${6:-fp32,bf16}")
    scheds+=("${7:-forward-lockstep reverse-warp}")
}
names=(); files=(); filters=(); olds=(); news=(); dtypes=(); scheds=()
mutate column_sum_no_barrier llmc/cuda/common.cuh rmsnorm \
    '__syncthreads();  // every row'"'"'s sum of this column is in s_sum' ''
mutate rmsnorm_with_mean_term llmc/cuda/layernorm.cuh rmsnorm \
    'const float mean_dn = RMS ? 0.0f : warp_sum(sum_dn)' 'const float mean_dn = warp_sum(sum_dn)'
mutate divergent_shuffle llmc/cuda/fp8.cuh fp8 \
    $'m = warp_max_u32(m);\n    if ((tid & 31) == 0) warp_m' \
    $'if ((tid & 31) < 16) m = warp_max_u32(m);\n    if ((tid & 31) == 0) warp_m'
mutate fp8_cast_next_tile_race llmc/cuda/fp8.cuh fp8 \
    '__syncthreads();  // the next tile overwrites this one' ''
mutate fp8_vec_cast_next_tile_race llmc/cuda/fp8.cuh fp8 \
    "__syncthreads();  // the next tile's codes and sums overwrite these" ''
mutate fp8_overflow_count_before_barrier llmc/cuda/fp8.cuh fp8 \
    $'__syncthreads();\n    if (threadIdx.x == 0) *step_overflows' 'if (threadIdx.x == 0) *step_overflows'
mutate smem_half_the_accumulators llmc/cuda/layernorm.cuh layernorm \
    '(size_t)W * Q * ln_acc_stride(C, K) * sizeof(float)' '(size_t)W * ln_acc_stride(C, K) * sizeof(float)'
mutate warps_summed_before_barrier llmc/cuda/layernorm.cuh layernorm \
    '__syncthreads();  // every warp'"'"'s accumulators are complete' ''
mutate off_by_one_store llmc/cuda/layernorm.cuh residual \
    'for (long long j = i; j < n; j++) out[j]' 'for (long long j = i; j <= n; j++) out[j]'
mutate pack_alignment_ignored llmc/cuda/common.cuh residual \
    'if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return 1;' ''
mutate lse_warps_before_barrier llmc/cuda/classifier.cuh cross_entropy \
    $'__syncthreads();\n    const bool has' 'const bool has'
mutate bias_grad_no_barrier llmc/cuda/matmul.cuh matmul \
    $'sums[threadIdx.y][threadIdx.x * V + j] = acc[j];\n    __syncthreads();' \
    'sums[threadIdx.y][threadIdx.x * V + j] = acc[j];'
mutate fp8_layout_NN llmc/cuda/fp8.cuh fp8 \
    'CUBLASLT_MATMUL_DESC_TRANSA, &opT' 'CUBLASLT_MATMUL_DESC_TRANSA, &opN'
mutate flash_buffer_race llmc/cuda/flash_attention.cuh attention \
    $'__syncthreads();  // the next iteration\'s prefetch overwrites this buffer\n    }\n\n    if (!active)' \
    $'}\n\n    if (!active)' bf16
mutate flash_last_kv_tile_not_waited llmc/cuda/flash_attention.cuh attention \
    $'ptx::cp_async_wait<1>();\n    } else {\n        ptx::cp_async_wait<0>();' \
    $'ptx::cp_async_wait<1>();\n    } else {\n        ptx::cp_async_wait<1>();' bf16 'reverse-warp forward-lockstep'
mutate flash_q_smem_mtile llmc/cuda/flash_attention.cuh attention_mt2 \
    'ptx::ldmatrix_x4(qs[mt], qrow + 16 * mt * LD + kc * 16)' 'ptx::ldmatrix_x4(qs[mt], qrow + kc * 16)' bf16
mutate dkdv_mtile_slip llmc/cuda/flash_backward.cuh attention \
    'ptx::mma_16816_x2<E>(s[m][2 * np], s[m][2 * np + 1], ka[m], r)' \
    'ptx::mma_16816_x2<E>(s[m][2 * np], s[m][2 * np + 1], ka[0], r)' bf16
mutate flash_dq_without_D llmc/cuda/flash_backward.cuh attention \
    'dp[m][n][e] = p * (dp[m][n][e] - Dr[m][i]);' 'dp[m][n][e] = p * dp[m][n][e];' bf16
mutate flash_ds_unseen_keys_read llmc/cuda/flash_backward.cuh attention_ring \
    'if (k0 + 64 > w_full) {  // crossing' 'if (false && k0 + 64 > w_full) {  // crossing' bf16
mutate fused_ds_before_barrier llmc/cuda/flash_backward_fused.cuh attention_fused \
    '__syncthreads();  // the tile'"'"'s dS^T, every warp'"'"'s keys' '' bf16
mutate fused_ds_stale_where_skipped llmc/cuda/flash_backward_fused.cuh attention_fused \
    'zero_ds_cols<E, 1>(dsw, LDS, 0, BQ);' ';' bf16
mutate wgmma_vt_unswizzled llmc/cuda/flash_forward_wgmma.cuh attention_wgmma \
    'dst + sw128(row, p / 4) + (p % 4) * 4' 'dst + row * 128 + (p / 4) * 16 + (p % 4) * 4' bf16
mutate wgmma_acc_product_without_fence llmc/cuda/flash_forward_wgmma.cuh attention_wgmma \
    $'    ptx::wgmma_fence();\n    wg_issue_acc<E, N, MN>(d, a, xt);' '    wg_issue_acc<E, N, MN>(d, a, xt);' bf16
mutate wgmma_mn_kstep_one_row_group llmc/cuda/flash_forward_wgmma.cuh attention_wgmma_mn \
    'ptx::wgmma_desc_sw128_mn(xt, kc * 2048, 8192)' 'ptx::wgmma_desc_sw128_mn(xt, kc * 1024, 8192)' bf16
mutate wgmma_mn_v_into_buffer_in_use llmc/cuda/flash_forward_wgmma.cuh attention_wgmma_mn \
    'wg_load_k<HS>(sVt + (jv & 1) * L::vtt' 'wg_load_k<HS>(sVt + ((jv + 1) & 1) * L::vtt' bf16
mutate wgmma_mn_pipelined_two_k_buffers llmc/cuda/flash_backward_wgmma.cuh attention_wgmma_mn \
    'static constexpr int nk = PIPE && MN ? 3 : 2;' 'static constexpr int nk = 2;' bf16
mutate wgmma_mn_pipelined_two_q_buffers llmc/cuda/flash_backward_wgmma.cuh attention_wgmma_mn \
    'static constexpr int nq = PIPE && MN ? 3 : 2;' 'static constexpr int nq = 2;' bf16
mutate wgmma_k_waited_too_late llmc/cuda/flash_forward_wgmma.cuh attention_wgmma \
    "ptx::cp_async_wait<1>();  // every group but this iteration's" 'ptx::cp_async_wait<2>();' bf16 \
    'reverse-warp forward-lockstep'
mutate wgmma_proxy_fence_dropped llmc/cuda/flash_forward_wgmma.cuh attention_wgmma \
    "ptx::fence_proxy_async();  // this thread's copies and V^T stores, to the tensor cores' reads" '' bf16
mutate wgmma_s_read_before_wait llmc/cuda/flash_forward_wgmma.cuh attention_wgmma \
    $'ptx::wgmma_wait0(s);\n            wg_softmax' 'wg_softmax' bf16
mutate wgmma_pipelined_p_overwritten_in_flight llmc/cuda/flash_forward_wgmma.cuh attention_wgmma \
    $'scale_log2);\n            ptx::wgmma_wait<0>(o);' $'scale_log2);\n            wg_acc_a<E>(pa, s);\n            ptx::wgmma_wait<0>(o);' bf16
mutate wgmma_pipelined_ds_overwritten_in_flight llmc/cuda/flash_backward_wgmma.cuh attention_wgmma \
    $'ds_of(s, dp, k0);\n            ptx::wgmma_wait<0>(dq);' $'ds_of(s, dp, k0);\n            wg_acc_a<E>(da, dp);\n            ptx::wgmma_wait<0>(dq);' bf16
mutate wgmma_pipelined_pt_overwritten_in_flight llmc/cuda/flash_backward_wgmma.cuh attention_wgmma \
    $'p_ds(s, dp, buf, q0);\n            wait_dv_dk();' $'p_ds(s, dp, buf, q0);\n            wg_acc_a<E>(ap, s);\n            wait_dv_dk();' bf16
mutate wgmma_ss_one_warpgroups_keys llmc/cuda/flash_backward_wgmma.cuh attention_wgmma \
    'const char* wk = smem + L::k + (warp / 4) * QB;' 'const char* wk = smem + L::k;' bf16
mutate wgmma_dq_ss_one_warpgroups_rows llmc/cuda/flash_backward_wgmma.cuh attention_wgmma \
    'const char* wq = smem + L::q + (warp / 4) * L::kt;' 'const char* wq = smem + L::q;' bf16
mutate wgmma_dq_without_D llmc/cuda/flash_backward_wgmma.cuh attention_wgmma \
    'dp[n][e] = p * (dp[n][e] - Dr[i]);' 'dp[n][e] = p * dp[n][e];' bf16
mutate wgmma_dkdv_unmasked llmc/cuda/flash_backward_wgmma.cuh attention_wgmma \
    'const bool vis = full || (qi < Tq && kpos[e >> 1] <= qp.at(qi));' 'const bool vis = true;' bf16
mutate fp8_vec_cast_gelu_dropped llmc/cuda/fp8.cuh fp8 \
    'v[e] = operand(v[e], gelu);' '(void)gelu;'
mutate ln_bwd_registers_dinp_unread llmc/cuda/layernorm.cuh layernorm \
    'pg[j] = load_pack<K>(dinp + off + i * K);' 'pg[j] = pd[j];'
mutate fp8_stash_left_unwritten llmc/cuda/fp8.cuh fp8 \
    'cast(ci, inp, N, IC, qi, (__nv_fp8_storage_t*)stash.qT, 0, stream' 'cast(ci, inp, N, IC, qi, nullptr, 0, stream'
mutate fp8_colsum_half_the_lanes llmc/cuda/fp8.cuh fp8 \
    'acc[e] += __shfl_xor_sync(0xffffffffu, acc[e], 16);' ''

# the mutated copies build without -g (debug information costs a quarter of the compile time, 16 s
# -> 12 s for cuda_ops.cu here, and GCC emits the same code with it or without it) and at -O0:
# cuda_ops.cu took 19 s at -O2, 13 s at -O1, 6.4 s at -O0 here, where a mutant's run, which ends at
# its first FAIL, is a few seconds (the whole attention filter: 8.4 s at -O1, 14.5 s at -O0). With
# 2026-11-27's kernels: cuda_ops.cu 9.8 s and attention.cu 5.4 s at -O0 (one file, 30 s, before the
# split and the emulator's leaner launch); 2026-11-28: attention.cu 11.9 s, split by element type
# attention_bf16.cu 5.6 s, _f16 5.7 s, _f32 1.9 s
flags=()
for f in $EMU_FLAGS; do
    case $f in -g|-g1) ;; -O2) flags+=(-O0) ;; *) flags+=("$f") ;; esac
done

# the backend's translation units as the Makefile's EMU_CUDA_OBJS (each with its dependency file)
tus=()
for tu in llmc/cuda/*.cu; do
    [ "$tu" = llmc/cuda/comm_nccl.cu ] && continue
    [ -s "$B/emu/${tu%.cu}.d" ] || { echo "planted bugs: $B/emu/${tu%.cu}.d missing (make test-emu builds it)"; exit 1; }
    tus+=("$tu")
done

# plant I: builds mutation I's copy and runs its cases; prints one line, CAUGHT or MISSED
plant() {
    local i=$1 name=${names[$1]} file=${files[$1]} filter=${filters[$1]}
    local d=$W/$name t0 t1 caught="" why sched
    rm -rf "$d" && mkdir -p "$d/llmc" && cp -r llmc/cuda "$d/llmc/"
    # the mutation must apply: an unchanged file would prove nothing
    OLD=${olds[$i]} NEW=${news[$i]} perl -0pi -e 's/\Q$ENV{OLD}\E/$ENV{NEW}/' "$d/$file"
    if cmp -s "$d/$file" "$file"; then
        echo "MISSED $name: the mutation did not apply to $file (the source changed: update this script)"
        return
    fi
    # the mutated copies shadow llmc/cuda (-I$d first); the rest of the tree is the real one. Only
    # the backend's translation units that include the mutated file (their make dependencies) are
    # compiled again, and of those of one element type (attention_f32.cu, _bf16, _f16) only the
    # types the mutation's cases run (the others' code is not run by them); the rest link as make
    # built them
    t0=$(date +%s)
    local objs=() tu o ty
    : > "$d/build.log"
    for tu in "${tus[@]}"; do
        o=$B/emu/${tu%.cu}.o
        case $tu in *_f32.cu) ty=fp32 ;; *_bf16.cu) ty=bf16 ;; *_f16.cu) ty=fp16 ;; *) ty="" ;; esac
        if grep -q -F -w -- "$file" "${o%.o}.d" && { [ -z "$ty" ] || [[ ,${dtypes[$i]}, == *,$ty,* ]]; }; then
            $CXX -I"$d" "${flags[@]}" -x c++ -c "$d/$tu" -o "$d/$(basename "$o")" 2>> "$d/build.log" ||
                { echo "MISSED $name: the mutated copy of $tu does not build (see $d/build.log)"; return; }
            o=$d/$(basename "$o")
        fi
        objs+=("$o")
    done
    if ! $CXX "${flags[@]}" -o "$d/test_gpu_emu" "$B/emu/test/gpu/test_gpu.o" "${objs[@]}" $B/emu/test/cuemu/cuemu.o \
           $B/emu/test/cuemu/cublaslt.o $B/libllmc.a ${MPI_LIBS:-} -lboost_context 2>> "$d/build.log"; then
        echo "MISSED $name: the mutated copy does not link (see $d/build.log)"
        return
    fi
    if ! grep -q "^$d/" <(printf '%s\n' "${objs[@]}"); then
        echo "MISSED $name: no translation unit includes $file (none was built again)"
        return
    fi
    t1=$(date +%s)
    for sched in ${scheds[$i]}; do
        # (the braces take bash's own "Aborted" line: an abort is an expected outcome here)
        # (the first FAIL ends the run)
        if ! { CUEMU_SCHEDULE=$sched CUEMU_LT_QUIET=1 LLMC_TEST_DTYPES=${dtypes[$i]} LLMC_TEST_FAIL_FAST=1 \
                   LLMC_GPU_DIGEST="$d/digest.$sched" "$d/test_gpu_emu" "$filter" \
               > "$d/out.$sched" 2>&1; } 2> /dev/null; then
            why=$(grep -m1 -E '^cuemu|^FAIL' "$d/out.$sched" | cut -c1-160)
            caught="$sched: ${why:-exit status non-zero}"
            break
        fi
    done
    if [ -z "$caught" ] && ! cmp -s "$d/digest.forward-lockstep" "$d/digest.reverse-warp"; then
        caught="the two schedules' digests differ"
    fi
    if [ -n "$caught" ]; then
        echo "CAUGHT $name ($filter): $caught (build $((t1 - t0))s, run $(($(date +%s) - t1))s)"
    else
        echo "MISSED $name ($filter): passed in both schedules with equal digests"
    fi
}

# the mutations are independent (each its own folder): PLANT_JOBS of them at a time (default: one
# per core), each compile single-threaded; the lines are printed in the table's order
jobs_max=${PLANT_JOBS:-$(nproc)}
mkdir -p "$W" && rm -f "$W"/*.result
for i in "${!names[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n; done
    plant "$i" > "$W/${names[$i]}.result" 2>&1 &
done
wait
for name in "${names[@]}"; do
    cat "$W/$name.result"
    grep -q '^CAUGHT ' "$W/$name.result" || missed=$((missed + 1))
done
[ $missed -eq 0 ]
