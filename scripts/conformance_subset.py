"""Writes refimpl/data/conformance/ci.txt: the named subset `refimpl conformance --subset ci` judges (and CI runs).

    python scripts/conformance_subset.py BINDIR [--per-op 3] [--unsupported 2]

From test-backend-ops' own case list (its `support` mode, ggml-cpu's answer per case): per op, `--per-op` cases
spread evenly over the op's list (its first, its last and between), plus up to `--unsupported` cases ggml-cpu
cannot run (judged against refimpl alone), plus the cases named in MUST (the SUM of a permuted tensor, where
ggml-cpu sums the wrong elements) and COMPOSITE (the fused and composite tests, which `support` does not list).
Deterministic: the same build gives the same file.
"""
import argparse
import csv
import io
import subprocess
from pathlib import Path

MUST = ["SUM(type=f32,ne=[33,256,1,1],permute=[1,0,2,3])"]
# test-backend-ops' `support` mode does not list its fused and composite tests: the first and last case of each,
# in its run order (from a whole-suite run of `refimpl conformance -b cpu`)
COMPOSITE = [
    "ADD_ADD(type=f32,type_addend=f32,ne=[64,5,4,3],broadcast=0,view=0)",
    "ADD_ADD(type=f16,type_addend=f32,ne=[1025,5,4,3],broadcast=1,view=0)",
    "ADD_RMS_NORM(type=f32,ne=[64,5,4,3],eps=0.000000,broadcast=0)",
    "ADD_RMS_NORM(type=f32,ne=[16896,1,1,1],eps=0.000001,broadcast=0)",
    "GELU_MUL(type=f16,ne=[128,2,2,2],swap=0,layout=packed,tail=)",
    "GELU_MUL(type=bf16,ne=[128,2,2,2],swap=0,layout=packed,tail=reuse)",
    "L2_NORM_BATCH(type=f32,ne=[64,5,4,3],n_norms=2,eps=0.000000,strided=1)",
    "L2_NORM_BATCH(type=f32,ne=[1025,5,4,3],n_norms=4,eps=10.000000,strided=0)",
    "MUL_MAT_ID_FUSION(type_a=f16,type_b=f32,n_mats=16,n_used=16,b=0,m=32,n=32,k=32,o=3,mul=0)",
    "MUL_MAT_ID_FUSION(type_a=q4_K,type_b=f32,n_mats=128,n_used=8,b=0,m=768,n=512,k=2048,o=1,mul=1)",
    "NORM_MUL_ADD(type=f32,ne=[64,5,4,3],eps=0.000000,broadcast=0)",
    "NORM_MUL_ADD(type=f32,ne=[1025,5,4,3],eps=1.000000,broadcast=1)",
    "NORM_SCALE(type=f32,ne=[64,5,4,3],eps=0.000000,rms=0,scale=1.500000)",
    "NORM_SCALE(type=f32,ne=[1025,5,4,3],eps=10.000000,rms=0,scale=1.500000)",
    "RELU_SQR(type=f16,ne=[128,2,2,2])",
    "RELU_SQR(type=f32,ne=[5,7,11,13])",
    "RMS_NORM_MUL_ADD(type=f32,ne=[64,5,4,3],eps=0.000000,broadcast=0,multi_add=0,post_mul=0,alias_rms_input=0,weight_broadcast=0)",
    "RMS_NORM_MUL_ADD(type=f32,ne=[256,4,1,1],eps=0.000001,broadcast=0,multi_add=0,post_mul=0,alias_rms_input=1,weight_broadcast=0)",
    "RMS_NORM_MUL_ROPE(ne=[256,1,1,1],eps=0.000001,multi_add=0,mul=0,rope=0,set_rows=1,broadcast=0,mode=0,set_rows_type=f32)",
    "RMS_NORM_MUL_ROPE(ne=[8192,2,2,1],eps=0.000001,multi_add=1,mul=1,rope=1,set_rows=1,broadcast=1,mode=40,set_rows_type=f16)",
    "RMS_NORM_SCALE(type=f32,ne=[64,5,4,3],eps=0.000000,rms=1,scale=1.500000)",
    "RMS_NORM_SCALE(type=f32,ne=[1025,5,4,3],eps=10.000000,rms=1,scale=1.500000)",
    "ROPE_SET_ROWS(type=f16,type_idx=i64,ne_a=[128,32,1,1],mode=0)",
    "ROPE_SET_ROWS(type=f32,type_idx=i32,ne_a=[128,32,8,1],mode=40)",
    "SIGMOID_MUL(type=f16,ne=[128,2,2,2],swap=0,layout=packed,tail=)",
    "SIGMOID_MUL(type=bf16,ne=[128,2,2,2],swap=0,layout=packed,tail=reuse)",
    "SILU_MUL(type=f16,ne=[128,2,2,2],swap=0,layout=packed,tail=)",
    "SILU_MUL(type=bf16,ne=[128,2,2,2],swap=0,layout=packed,tail=reuse)",
    "SNAKE_FUSE(type=f32,ne=[5,7,1,1])",
    "SNAKE_FUSE(type=bf16,ne=[64,32,2,3])",
    "SOFTCAP(type=f32,ne=[10,10,10,10],softcap=50.000000)",
    "SOFTPLUS_MUL(type=f16,ne=[128,2,2,2],swap=0,layout=packed,tail=)",
    "SOFTPLUS_MUL(type=bf16,ne=[128,2,2,2],swap=0,layout=packed,tail=reuse)",
    "SSM_CONV_BIAS_SILU(type=f32,ne_a=[3,1024,1,1],ne_b=[3,1024,1,1],fuse_bias=0)",
    "SSM_CONV_BIAS_SILU(type=f32,ne_a=[72,2048,4,1],ne_b=[9,2048,1,1],fuse_bias=1)",
    "SSM_SCAN_ROLLBACK(type=f32,d_state=96,head_dim=64,n_head=16,n_group=8,n_seq_tokens=8,n_seqs=2,K=3)",
    "SSM_SCAN_ROLLBACK(type=f32,d_state=128,head_dim=64,n_head=16,n_group=2,n_seq_tokens=8,n_seqs=2,K=3)",
    "TOPK_QSA(n_blocks=512,n_kv=2048,n_tps=1,n_stream=1,width=1500)",
    "TOPK_QSA(n_blocks=64,n_kv=256,n_tps=2,n_stream=1,width=200)",
]
OUT = Path(__file__).resolve().parents[1] / "refimpl" / "data" / "conformance" / "ci.txt"


def spread(items, k):
    if len(items) <= k:
        return list(items)
    return [items[round(i * (len(items) - 1) / (k - 1))] for i in range(k)] if k > 1 else [items[0]]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bindir")
    ap.add_argument("--per-op", type=int, default=3)
    ap.add_argument("--unsupported", type=int, default=2)
    a = ap.parse_args()
    p = subprocess.run([f"{a.bindir}/test-backend-ops", "support", "-b", "CPU", "--output", "csv"],
                       capture_output=True, text=True, check=True)
    rows = list(csv.DictReader(io.StringIO(p.stdout)))
    by_op, unsup = {}, {}
    for r in rows:
        case = f"{r['op_name']}({r['op_params']})"
        (by_op if r["supported"] == "1" else unsup).setdefault(r["op_name"], []).append(case)
    picked = []
    for op in sorted(set(by_op) | set(unsup)):
        picked += spread(by_op.get(op, []), a.per_op) + spread(unsup.get(op, []), a.unsupported)
    for c in MUST + COMPOSITE:
        if c not in picked:
            picked.append(c)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("# test-backend-ops cases judged in CI (scripts/conformance_subset.py "
                   f"--per-op {a.per_op} --unsupported {a.unsupported})\n" + "\n".join(picked) + "\n")
    print(f"{len(picked)} cases of {len(by_op | unsup)} ops -> {OUT}")


if __name__ == "__main__":
    main()
