from tvm.script import tirx as T
# from tvm.script import tirx as T
# from tvm.tirx.layout import Axis

@T.prim_func(s_tir=True)
def main(lv11: T.Buffer((T.int64(2048), T.int64(2048)), "float16"), param_0: T.Buffer((T.int64(2048), T.int64(5632)), "float16"), param_1: T.Buffer((T.int64(5632),), "float16"), T_add_intermediate: T.Buffer((T.int64(2048), T.int64(5632)), "float16")):
    T.func_attr({"tirx.noalias": True})
    # with T.sblock("root"):
    matmul_intermediate = T.sblock_alloc_buffer((T.int64(2048), T.int64(5632)))
    compute_intermediate = T.sblock_alloc_buffer((T.int64(2048), T.int64(5632)), "float16")
    for i0, i1, k in T.grid(T.int64(2048), T.int64(5632), T.int64(2048)):
        with T.sblock("matmul"):
            v_i0, v_i1, v_k = T.axis.remap("SSR", [i0, i1, k])
            T.reads(lv11[v_i0, v_k], param_0[v_k, v_i1])
            T.writes(matmul_intermediate[v_i0, v_i1])
            with T.init():
                matmul_intermediate[v_i0, v_i1] = T.float32(0.0)
            matmul_intermediate[v_i0, v_i1] = matmul_intermediate[v_i0, v_i1] + T.Cast("float32", lv11[v_i0, v_k]) * T.Cast("float32", param_0[v_k, v_i1])
    for i0, i1 in T.grid(T.int64(2048), T.int64(5632)):
        with T.sblock("compute"):
            v_i0, v_i1 = T.axis.remap("SS", [i0, i1])
            T.reads(matmul_intermediate[v_i0, v_i1])
            T.writes(compute_intermediate[v_i0, v_i1])
            compute_intermediate[v_i0, v_i1] = T.Cast("float16", matmul_intermediate[v_i0, v_i1])
    for ax0, ax1 in T.grid(T.int64(2048), T.int64(5632)):
        with T.sblock("T_add"):
            v_ax0, v_ax1 = T.axis.remap("SS", [ax0, ax1])
            T.reads(param_1[v_ax1], compute_intermediate[v_ax0, v_ax1])
            T.writes(T_add_intermediate[v_ax0, v_ax1])
            T_add_intermediate[v_ax0, v_ax1] = param_1[v_ax1] + compute_intermediate[v_ax0, v_ax1]
