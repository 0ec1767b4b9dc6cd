"""native-cpu's kernel model: the kernels the executor's planner makes of each group, costed by
the general estimator, and `--runtime native-cpu` picking native-cpu's calibration."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from onnxlens import analyze
from onnxlens.analyzer.calibration import Calibration, Curve, host_name, resolve_target
from onnxlens.analyzer.errors import UsageError
from onnxlens.analyzer.hardware import NATIVE_CPU, NATIVE_CUDA, ORT_CPU
from onnxlens.analyzer.host import detect_cpu, host_profile
from onnxlens.analyzer.runtimes import kernel_model
from onnxlens.backends.calibrate.catalogue import benchmarks
from onnxlens.backends.calibrate.measure import _kernels_of, _point
from onnxlens.backends.native.catalogue import GEMM_TILES
from onnxlens.backends.native.kernel_model import (
    NATIVE_CPU_MODEL,
    NATIVE_CUDA_MODEL,
    cuda_kernel_ops,
    tile_work,
    winograd_lanes,
)
from onnxlens.cli import app

RNG = np.random.default_rng(0)


def _init(name: str, *shape: int) -> onnx.TensorProto:
    return numpy_helper.from_array(RNG.standard_normal(shape).astype(np.float32), name)


def _save(tmp_path: Path, nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto],
          x: list[int], y: list[int]) -> Path:
    graph = helper.make_graph(nodes, "m",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, x)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, y)], inits)
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                ir_version=8), path)
    return path


def _kernels(path: Path, model: object = NATIVE_CPU_MODEL) -> tuple[object, dict]:
    r = analyze(path)
    costs = {k: nc.cost for k, nc in r.node_costs.items()}
    out = model.kernels(r.graph, r.groups, costs,
                        {g: nc.cost for g, nc in r.group_costs.items()}, host_profile(1), r.model)
    return r, out


def _attention(tmp_path: Path, s: int, d: int) -> Path:
    """softmax(x·xᵀ)·x of x [s, d]: one fused attention group."""
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0]),
             helper.make_node("MatMul", ["x", "xt"], ["scores"]),
             helper.make_node("Softmax", ["scores"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "x"], ["y"])]
    return _save(tmp_path, nodes, [], [s, d], [s, d])


def test_the_models_register_with_the_backends() -> None:
    assert kernel_model(NATIVE_CPU) is NATIVE_CPU_MODEL
    assert kernel_model(NATIVE_CUDA) is NATIVE_CUDA_MODEL


# Output channels of the convolutions below: whole row tiles on every ISA (mr 8, 6 and 4), so
# that their MACs are the layer's own (a partial tile computes whole: `tile_work`).
C = 24


@pytest.mark.skipif(not winograd_lanes(), reason="no Winograd convolution on this CPU")
def test_a_winograd_convolution_is_charged_its_products_and_transforms(tmp_path: Path) -> None:
    """32 -> 32 channels, 3x3, stride 1, a 7 x 7 output: 4 x 4 tiles of 2 x 2 pixels (the
    last row and column of tiles half outside), per tile 16 products per channel and filter
    plus the transforms' 32 adds per channel and 24 per filter: (16·32·32 + 32·32 + 24·32)·16
    = 290,816, where direct convolution takes 7·7·32·32·9 = 451,584 multiply-adds."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])]
    r, out = _kernels(_save(tmp_path, nodes, [_init("w", 32, 32, 3, 3)], [1, 32, 7, 7],
                            [1, 32, 7, 7]))
    (k,) = out[r.groups[0].id]
    assert (k.cls, k.cost.macs) == ("conv", 290_816)
    assert r.group_costs[r.groups[0].id].cost.macs == 451_584


def test_a_conv_with_its_epilogue_is_one_kernel(tmp_path: Path) -> None:
    """Conv + bias + residual Add + Relu (ResNet's block end): one kernel of the group's own
    cost; the Add and the Relu run in its epilogue (at the kernel's rate), not in a pass of
    their own."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "x"], ["r"]),
             helper.make_node("Relu", ["r"], ["y"])]
    path = _save(tmp_path, nodes, [_init("w", C, C, 3, 3), _init("b", C)],
                 [1, C, 16, 16], [1, C, 16, 16])
    r, out = _kernels(path)
    (group,) = r.groups
    (k,) = out[group.id]
    assert k.cls == "conv" and k.nodes == tuple(group.nodes)
    assert k.cost.macs == 16 * 16 * C * C * 9  # H·W·Cout·Cin·kh·kw
    out_bytes = C * 16 * 16 * 4
    # reads x (once, for the conv and the residual), w, b; writes y
    assert k.cost.bytes_read == out_bytes + (C * C * 9 + C) * 4
    assert k.cost.bytes_written == out_bytes
    assert not k.epilogue.other_flops  # no activation pass after the kernel


def test_an_epilogue_the_tile_cannot_store_is_a_pass_after_it(tmp_path: Path) -> None:
    """Conv + bias + SiLU (Sigmoid, Mul): the tile applies only ops.def's TILE_EPILOGUE
    operations as it stores, so the core runs this program over the output after the tile: the
    Sigmoid's and the Mul's FLOPs are the kernel's epilogue pass (costed at the elementwise
    rate), 1 FLOP + 1 sigmoid and 1 FLOP per output element; the Conv (MACs and its bias)
    stays the kernel's. With a Relu instead, the tile applies it: no pass."""
    n = C * 16 * 16  # output elements
    silu = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("Sigmoid", ["c"], ["s"]),
            helper.make_node("Mul", ["c", "s"], ["y"])]
    relu = [silu[0], helper.make_node("Relu", ["c"], ["y"])]
    inits = [_init("w", C, C, 3, 3), _init("b", C)]
    r, out = _kernels(_save(tmp_path, silu, inits, [1, C, 16, 16], [1, C, 16, 16]))
    (k,) = out[r.groups[0].id]
    assert (k.epilogue.other_flops, k.epilogue.transcendental) == (2 * n, n)
    assert (k.cost.macs, k.cost.other_flops, k.cost.transcendental) == (n * C * 9, n, 0)
    assert k.cost.bytes_written == n * 4  # the pass works on the output in cache
    r, out = _kernels(_save(tmp_path, relu, inits, [1, C, 16, 16], [1, C, 16, 16]))
    (k,) = out[r.groups[0].id]
    assert not k.epilogue.other_flops and k.cost.other_flops == 2 * n  # bias, Relu


def test_a_native_calibration_point_is_read_through_the_plan(tmp_path: Path) -> None:
    """A native-cpu calibration point is what the kernel model will cost: Conv + HardSwish is
    a conv kernel with the HardSwish (5 FLOPs per output element) as its pass, which the fit
    takes out at the elementwise rate; an attention block, one group that the plan runs as
    MatMul, Softmax, MatMul, is no point."""
    hw = host_profile(1)
    native = _kernels_of(NATIVE_CPU, hw)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["c"], ["y"])]
    conv = onnx.load(_save(tmp_path, nodes, [_init("w", C, C, 3, 3)], [1, C, 16, 16],
                           [1, C, 16, 16]))
    p = _point("conv", conv, 1e-3, 0.0, 0.0, native)
    assert p is not None and (p.op_class, p.pass_flops, p.macs) == (
        "conv", 5 * C * 16 * 16, C * 16 * 16 * C * 9)
    bench = next(b for b in benchmarks() if b.name.startswith("Attention"))
    attention = bench.build()
    assert len(analyze(attention).groups) == 1
    assert _point(bench.name, attention, 1e-3, 0.0, 0.0, native) is None


def test_a_depthwise_conv_keeps_its_class(tmp_path: Path) -> None:
    """A depthwise Conv is a `depthwise` kernel of one call per channel plane (8 here), its
    MACs those of the core's blocks of 16 output columns: at stride 1, 16 x 16 outputs, as
    many as the plane's taps (8·16·16·9); at stride 2, 8 x 8 outputs, each row one block of
    16 columns (2x its 8) whose output vectors load two input vectors per tap (2x):
    4 x 8·8·8·9; a 7 x 7 plane at stride 1 is one flat row of 49 outputs in 4 vectors,
    64 of them computed (8·64·9), where rows of 16 columns would compute 7·16; a 20 x 20
    plane (two blocks of 16 per row) is 25 whole vectors, 400 outputs, not 20·32."""
    for stride, side in ((1, 16), (2, 8)):
        nodes = [helper.make_node("Conv", ["x", "w"], ["c"], group=8, pads=[1, 1, 1, 1],
                                  strides=[stride, stride]),
                 helper.make_node("Relu", ["c"], ["y"])]
        path = _save(tmp_path, nodes, [_init("w", 8, 1, 3, 3)], [1, 8, 16, 16],
                     [1, 8, side, side])
        r, out = _kernels(path)
        (k,) = out[r.groups[0].id]
        work = {1: 1, 2: 4}[stride]
        assert (k.cls, k.calls, k.cost.macs) == ("depthwise", 8, work * 8 * side * side * 9)
    for side, computed in ((7, 64), (20, 400)):
        nodes = [helper.make_node("Conv", ["x", "w"], ["y"], group=8, pads=[1, 1, 1, 1])]
        r, out = _kernels(_save(tmp_path, nodes, [_init("w", 8, 1, 3, 3)], [1, 8, side, side],
                                [1, 8, side, side]))
        (k,) = out[r.groups[0].id]
        assert (k.cls, k.calls, k.cost.macs) == ("depthwise", 8, 8 * computed * 9)


def test_a_global_pool_is_a_reduction(tmp_path: Path) -> None:
    """The core runs a GlobalAveragePool as a row sum per channel plane, the kernel a
    ReduceMean over contiguous axes runs: its class is reduce, a windowed pool's is pool."""
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["y"])]
    r, out = _kernels(_save(tmp_path, nodes, [], [1, 8, 6, 6], [1, 8, 1, 1]))
    assert [k.cls for k in out[r.groups[0].id]] == ["reduce"]
    nodes = [helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2])]
    r, out = _kernels(_save(tmp_path, nodes, [], [1, 8, 6, 6], [1, 8, 3, 3]))
    assert [k.cls for k in out[r.groups[0].id]] == ["pool"]


def test_a_view_shares_its_inputs_bytes(tmp_path: Path) -> None:
    """Relu -> Reshape: the analysis charges the Reshape nothing (a view), and the executor
    runs nothing for it either (its output shares the Relu's bytes: plan.aliases_of_copies),
    where it ran a Copy of 192 bytes each way; the Relu's kernel is costed as before."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Reshape", ["r", "shape"], ["y"])]
    shape = numpy_helper.from_array(np.array([6, 8], np.int64), "shape")
    r, kernels = _kernels(_save(tmp_path, nodes, [shape], [2, 3, 8], [6, 8]))
    view = next(g for g in r.groups if g.pattern == "Reshape")
    assert r.group_costs[view.id].cost.bytes_read == 0
    assert kernels[view.id] == []
    (relu,) = kernels[next(g.id for g in r.groups if g.pattern == "Relu")]
    assert (relu.cost.bytes_read, relu.cost.bytes_written) == (192, 192)


def test_copies_count_the_separate_copies_the_core_makes(tmp_path: Path) -> None:
    """`runs`, each a fixed cost beyond the bytes, read from the plan's kernels on x [1, 4, 6,
    8]: a Pad of H by 1 each side is a MapCopy of a fill, one memcpy of the 6 rows of 8
    and a fill per (1, 4) index (3 x 4 = 12; element by element it was 256); a Transpose
    (0, 2, 1, 3) keeps the last dim contiguous, one run of 8 per (1, 6, 4) index = 24; (0, 3,
    2, 1) makes the innermost dim strided, copied element by element: no run, 192 `elements`
    (each a fixed cost of its own); (0, 2, 3, 1), NCHW -> NHWC, is a blocked transpose (the
    dim before the innermost one, 6·8 pixels, contiguous in x): its bytes only; a Concat
    of two on axis 1 is one memcpy per part per index before the axis (1 x 2 = 2); a Gather of
    2 of the 4 rows on axis 1 is 1 x 2 copies of 6·8 floats, and reads only those (384
    bytes) and its indices (16 bytes), where the analysis charges all of x (768)."""
    pads = numpy_helper.from_array(np.array([0, 0, 1, 0, 0, 0, 1, 0], np.int64), "pads")
    rows = numpy_helper.from_array(np.array([2, 0], np.int64), "rows")
    nodes = [helper.make_node("Pad", ["x", "pads"], ["p"]),
             helper.make_node("Transpose", ["x"], ["t1"], perm=[0, 2, 1, 3]),
             helper.make_node("Transpose", ["x"], ["t2"], perm=[0, 3, 2, 1]),
             helper.make_node("Transpose", ["x"], ["t3"], perm=[0, 2, 3, 1]),
             helper.make_node("Concat", ["x", "x"], ["c"], axis=1),
             helper.make_node("Gather", ["x", "rows"], ["g"], axis=1)]
    nodes += [helper.make_node("ReduceSum", [t], [f"s{t}"], keepdims=0)
              for t in ("p", "t1", "t2", "t3", "c", "g")]
    nodes.append(helper.make_node("Sum", [f"s{t}" for t in ("p", "t1", "t2", "t3", "c", "g")],
                                  ["y"]))
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 4, 6, 8])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [])], [pads, rows])
    path = tmp_path / "copies.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                ir_version=8), path)
    r, out = _kernels(path)
    runs = {r.graph.info(k.nodes[0]).outputs[0].name: k.runs
            for g in r.groups for k in out[g.id] if k.cls == "data_movement"}
    assert runs == {"p": 12, "t1": 24, "t2": 0, "t3": 0, "c": 2, "g": 2}
    elements = {r.graph.info(k.nodes[0]).outputs[0].name: k.elements
                for g in r.groups for k in out[g.id] if k.cls == "data_movement"}
    assert elements == {"p": 0, "t1": 0, "t2": 1 * 6 * 8 * 4, "t3": 0, "c": 0, "g": 0}
    gather = next(k for g in r.groups for k in out[g.id] if k.nodes == (r.graph.producer["g"],))
    assert r.node_costs[gather.nodes[0]].cost.bytes_read >= 768
    assert gather.cost.bytes_read == 2 * 6 * 8 * 4 + 2 * 8


@pytest.mark.parametrize(("axis", "runs", "elements"), [
    (0, 2, 0),  # [1, 2, 12]: 2 rows of 12
    (1, 2 * 3, 0),  # [2, 3, 4]: 6 rows of 4
    (-1, 0, 2 * 3 * 4),  # [6, 4, 1]: each of the 24 sums waits for the one before
])
def test_a_cumsum_is_a_scan_of_rows(tmp_path: Path, axis: int, runs: int, elements: int
                                    ) -> None:
    """CumSum of x [2, 3, 4] (k_reduce.cpp `scan_block`): x as [outer, len, inner] around the
    axis, one loop per row of `inner` (outer·len `runs`), or along the last axis every
    element alone; 24 adds, 96 bytes written."""
    axis_value = numpy_helper.from_array(np.array(axis, np.int64), "axis")
    nodes = [helper.make_node("CumSum", ["x", "axis"], ["y"])]
    r, out = _kernels(_save(tmp_path, nodes, [axis_value], [2, 3, 4], [2, 3, 4]))
    (k,) = out[r.groups[0].id]
    assert (k.cls, k.runs, k.elements) == ("elementwise", runs, elements)
    assert (k.cost.other_flops, k.cost.bytes_written) == (24, 96)


@pytest.mark.parametrize(("shape", "spans"), [
    ((1, 4, 1, 1), 4),  # a squeeze-excite gate: one span per channel plane of 3·5
    ((5,), 12),  # a scale along the last dim: contiguous for 5, then broadcast: 1·4·3 spans
    ((1, 4, 3, 5), 0),  # same shape: one contiguous span, nothing beyond the bytes
    ((1,), 0),  # a scalar: broadcast over the whole output
])
def test_an_elementwise_program_pays_each_span_it_broadcasts_over(
        tmp_path: Path, shape: tuple[int, ...], spans: int) -> None:
    """x [1, 4, 3, 5] times an operand of `shape`: the core's program runs chunk by chunk,
    a chunk ending where any operand's index stops rising by one stride (ewprog.cpp
    `suffix_block`); each such span is a run of the kernel."""
    nodes = [helper.make_node("Mul", ["x", "s"], ["y"])]
    r, out = _kernels(_save(tmp_path, nodes, [_init("s", *shape)], [1, 4, 3, 5], [1, 4, 3, 5]))
    (k,) = out[r.groups[0].id]
    assert (k.cls, k.runs) == ("elementwise", spans)


def test_row_wise_kernels_count_their_passes_over_each_row(tmp_path: Path) -> None:
    """`rows`: rows x vector passes per row (k_norm.cpp, k_reduce.cpp, k_pool.cpp), each pass
    a fixed cost per row. x [2, 3, 4, 5]: LayerNormalization over the last two axes, 2·3 = 6
    rows of 20, 5 passes (sum, centre, square, sum, normalize): 30; Softmax on axis 1 (an
    inner axis: rows of 3 at stride 20), 2·4·5 = 40 rows, 3 passes (max, sum of exp, scale):
    120; ReduceMean over axis 3, one pass per output element, 2·3·4 = 24; GlobalAveragePool,
    one per channel plane, 2·3 = 6; InstanceNormalization, a row per channel plane of 20,
    2·3 = 6 rows, 5 passes: 30; a Relu, not row-wise: 0."""
    scale = numpy_helper.from_array(np.ones((4, 5), np.float32), "scale")
    channel = numpy_helper.from_array(np.ones(3, np.float32), "channel")
    nodes = [helper.make_node("LayerNormalization", ["x", "scale"], ["ln"], axis=2),
             helper.make_node("InstanceNormalization", ["x", "channel", "channel"], ["in"]),
             helper.make_node("Softmax", ["x"], ["sm"], axis=1),
             helper.make_node("ReduceMean", ["x"], ["rm"], axes=[3], keepdims=0),
             helper.make_node("GlobalAveragePool", ["x"], ["gp"]),
             helper.make_node("Relu", ["x"], ["r"])]
    nodes += [helper.make_node("ReduceSum", [t], [f"s{t}"], keepdims=0)
              for t in ("ln", "in", "sm", "rm", "gp", "r")]
    nodes.append(helper.make_node("Sum", [f"s{t}" for t in ("ln", "in", "sm", "rm", "gp", "r")],
                                  ["y"]))
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [2, 3, 4, 5])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [])], [scale, channel])
    path = tmp_path / "rows.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                ir_version=8), path)
    r, out = _kernels(path)
    rows = {r.graph.info(k.nodes[0]).outputs[0].name: k.rows
            for g in r.groups for k in out[g.id] if len(k.nodes) == 1}
    assert {t: rows[t] for t in ("ln", "in", "sm", "rm", "gp", "r")} == {
        "ln": 30, "in": 30, "sm": 120, "rm": 24, "gp": 6, "r": 0}


def test_a_native_point_has_the_bytes_its_kernel_copies(tmp_path: Path) -> None:
    """A Slice of the first half of x [1, 16, 6, 6] along channels is a Copy that reads only
    the half it writes: its calibration point has 2 x 8·6·6·4 = 2304 bytes, as the estimator
    costs the kernel, where the analysis charges all of x (16·6·6·4 = 2304) and the three
    int64 starts, ends and axes read, the half written: 2304 + 24 + 1152 = 3480."""
    starts, ends, axes = (numpy_helper.from_array(np.array([v], np.int64), n)
                          for n, v in (("starts", 0), ("ends", 8), ("axes", 1)))
    nodes = [helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["y"])]
    model = onnx.load(_save(tmp_path, nodes, [starts, ends, axes], [1, 16, 6, 6],
                            [1, 8, 6, 6]))
    total = analyze(model).total
    assert total.bytes_read + total.bytes_written == 3480
    p = _point("slice", model, 1e-3, 0.0, 0.0, _kernels_of(NATIVE_CPU, host_profile(1)))
    assert p is not None and (p.op_class, p.bytes) == ("data_movement", 2304)


def test_a_batched_matmul_is_a_gemm_per_matrix(tmp_path: Path) -> None:
    """[6, 16, 8] x [6, 8, 16] is 6 GEMM calls (one per matrix of the batch); x [8, 16], one B
    for every matrix, is one GEMM over 96 rows."""
    b = helper.make_node("MatMul", ["x", "w"], ["y"])
    batched = _save(tmp_path, [b], [_init("w", 6, 8, 16)], [6, 16, 8], [6, 16, 16])
    r, out = _kernels(batched)
    assert [k.calls for k in out[r.groups[0].id]] == [6]
    single = _save(tmp_path, [b], [_init("w", 8, 16)], [6, 16, 8], [6, 16, 16])
    r, out = _kernels(single)
    assert [k.calls for k in out[r.groups[0].id]] == [1]


def test_a_gemm_computes_whole_tiles() -> None:
    """The core's GEMM work over the product's own, by hand, on AVX-512's 12 x 32 tile:
    512 x 49 (ResNet's last 3x3 convolutions) computes 32 + 16 columns and 1 narrow one at 4
    (52 of 49); 512 x 196 six tiles, then 4 narrow columns (192 + 16); 512 x 784, 24 tiles
    and a vector of 16 (exact); 512 x 25, 16 + a vector of 16 for 9 (no narrow run past 4);
    240 x 1 (a squeeze-excite 1x1 convolution of one pixel) one narrow column (4); 1 x 1000
    (the classifier, a matrix-vector product) 1 x 1024; 25 x 16 is two tiles of a vector
    each and a one-row product 32 wide (24 x 16 + 32); 64 rows five tiles and one of 4 rows,
    computed as 4 (exact: the 4 x 32 instance); 10 rows one tile of 10. The ISA's tile is
    ops.def's row."""
    assert GEMM_TILES["avx512"] == (12, 32)
    assert tile_work(512, 49, 12, 32) == pytest.approx(52 / 49)
    assert tile_work(512, 196, 12, 32) == pytest.approx(208 / 196)
    assert tile_work(512, 784, 12, 32) == 1
    assert tile_work(512, 25, 12, 32) == pytest.approx(32 / 25)
    assert tile_work(240, 1, 12, 32) == 4
    assert tile_work(1, 1000, 12, 32) == pytest.approx(1.024)
    assert tile_work(25, 16, 12, 32) == pytest.approx((24 * 16 + 32) / (25 * 16))
    assert tile_work(64, 3136, 12, 32) == 1
    assert tile_work(10, 32, 12, 32) == 1
    assert tile_work(12, 49, 6, 16) == pytest.approx(52 / 49)  # AVX2: 3 x 16 + 1 narrow at 4


def test_attention_runs_as_the_planners_kernels(tmp_path: Path) -> None:
    """softmax(Q·Kᵀ)·V, one fused group, runs as the planner's three kernels (MatMul, Softmax,
    MatMul); the scores pass through scratch memory, so each kernel pays its own traffic: the
    [s, s] scores are written by the first and read by the second, the probabilities written
    by the second and read by the third."""
    s, d = 32, 16
    path = _attention(tmp_path, s, d)
    r, out = _kernels(path)
    kernels = [k for g in r.groups for k in out[g.id]]
    by_node = {k.nodes[-1]: k for k in kernels}
    qk, softmax, pv = (by_node[r.graph.producer[t]] for t in ("scores", "p", "y"))
    assert (qk.cls, softmax.cls, pv.cls) == ("gemm", "normalization", "gemm")
    # each a GEMM of s = 32 rows: Q·Kᵀ s columns, P·V d = 16, in whole vectors of nr / 2
    # columns (16 and 32 columns on every ISA: whole vectors); the rows in tiles of mr and a
    # last tile of its own rows (AVX-512's 12: 2 tiles and one of 8; AVX2's 6: 5 and one of
    # 2), none of one row: exactly the product's MACs
    assert qk.cost.macs == s * s * d
    assert pv.cost.macs == s * d * s
    assert qk.cost.bytes_written == s * s * 4 == softmax.cost.bytes_read
    assert softmax.cost.bytes_written == s * s * 4
    assert pv.cost.bytes_read == (s * s + s * d) * 4


def test_a_group_the_executor_cannot_run_is_one_kernel(tmp_path: Path) -> None:
    """The estimate stays complete: a group with an op the planner refuses (Erf on int32 is not
    float32) is costed as one kernel, as an uncalibrated profile would."""
    nodes = [helper.make_node("Cast", ["x"], ["i"], to=TensorProto.INT32),
             helper.make_node("Neg", ["i"], ["n"]),
             helper.make_node("Cast", ["n"], ["y"], to=TensorProto.FLOAT)]
    path = _save(tmp_path, nodes, [], [4, 4], [4, 4])
    r, out = _kernels(path)
    assert all(out[g.id] is not None for g in r.groups)


@pytest.fixture
def native_calibration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Calibration:
    monkeypatch.setenv("ONNXLENS_CACHE", str(tmp_path / "cache"))
    hw = host_profile(1)
    cal = Calibration(
        host=host_name(), cpu=detect_cpu().model, threads=1, peak_fp32_tflops=0.2,
        gemm_tflops=0.15, kernel_overhead_us=0.5,
        bandwidth_gbps={lv.name: 10.0 * (len(hw.memory) - i) for i, lv in enumerate(hw.memory)},
        curves={"elementwise": Curve(0.3, 2e3, 0.5), "conv": Curve(0.8, 1e6, 4.0),
                "gemm": Curve(0.9, 1e5, 2.0)},
        levels=[(lv.name, lv.size_bytes) for lv in hw.memory], points=(),
        ort_version="1.0", created="2026-01-01T00:00:00+00:00", duration_s=90.0,
        backend=NATIVE_CPU)
    cal.save()
    return cal


def test_a_group_folded_to_constants_runs_nothing(native_calibration: Calibration,
                                                  tmp_path: Path) -> None:
    """An int8 weight dequantized for two LayerNormalizations is a group of its own, folded
    before the run and kept as a constant its readers take: the plan runs no kernel for it,
    and its estimate is 0 s (the estimate had failed on the empty kernel list: RoBERTa's QDQ
    export, its LayerNorm biases)."""
    weight = numpy_helper.from_array(np.arange(8, dtype=np.int8), "wq")
    scale = numpy_helper.from_array(np.array(0.5, np.float32), "s")
    nodes = [helper.make_node("DequantizeLinear", ["wq", "s"], ["w"]),
             helper.make_node("LayerNormalization", ["x", "w"], ["n1"]),
             helper.make_node("LayerNormalization", ["n1", "w"], ["y"])]
    path = _save(tmp_path, nodes, [weight, scale], [2, 8], [2, 8])
    r, out = _kernels(path)
    (folded,) = [g for g in r.groups if g.nodes == ("DequantizeLinear_0",)]
    assert out[folded.id] == []
    est = analyze(path, hardware=["host"], threads=1, runtime=NATIVE_CPU).estimates["host"]
    assert est.groups[folded.id].latency_s == 0.0
    assert all(est.groups[g.id].latency_s > 0 for g in r.groups if g is not folded)


def test_runtime_picks_that_runtimes_calibration(native_calibration: Calibration,
                                                 tmp_path: Path) -> None:
    native, _ = resolve_target("host", 1, NATIVE_CPU)
    assert native.calibrated and native.runtime.name == NATIVE_CPU
    assert native.kernel_launch_us == 0.5
    ort_host, _ = resolve_target("host", 1, ORT_CPU)  # ORT has no calibration here
    assert not ort_host.calibrated
    with pytest.raises(UsageError, match="runtime 'tpu'"):
        resolve_target("host", 1, "tpu")
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    path = _save(tmp_path, nodes, [], [1, 1024], [1, 1024])
    est = analyze(path, hardware=["host"], threads=1, runtime=NATIVE_CPU).estimates["host"]
    assert est.calibrated and est.profile.runtime.name == NATIVE_CPU
    # one Relu kernel: 8 KB through the fastest level's 10·n GB/s, and the kernel's 0.5 us
    (group,) = est.groups.values()
    assert group is not None and group.overhead_s == pytest.approx(0.5e-6)


def test_cli_runtime_flag(native_calibration: Calibration, tmp_path: Path) -> None:
    path = _save(tmp_path, [helper.make_node("Relu", ["x"], ["y"])], [], [1, 64], [1, 64])
    out = CliRunner().invoke(app, ["analyze", str(path), "-H", "host", "--threads", "1",
                                   "--runtime", "native-cpu"])
    assert out.exit_code == 0, out.output
    bad = CliRunner().invoke(app, ["analyze", str(path), "-H", "host", "--runtime", "tpu"])
    assert bad.exit_code != 0 and "runtime 'tpu'" in bad.output
    assert "Traceback" not in bad.output


def test_native_cuda_costs_the_plans_launches_on_a_gpu_profile(tmp_path: Path) -> None:
    """native-cuda runs the same plan, one CUDA launch per plan kernel (the emulator's build of
    the CUDA lowering says which kernels it has): a MatMul-Softmax-MatMul group is three
    launches; a group with a kernel the CUDA executor lacks (Gather) is one kernel."""
    assert {"MatMul", "Softmax", "Elementwise"} <= cuda_kernel_ops()
    assert "Gather" not in cuda_kernel_ops()
    s, d = 32, 16
    path = _attention(tmp_path, s, d)
    r, cpu = _kernels(path)
    _, cuda = _kernels(path, NATIVE_CUDA_MODEL)
    assert [k.cls for k in cuda[r.groups[0].id]] == [k.cls for k in cpu[r.groups[0].id]]
    # the CPU core's GEMM tiles are not the CUDA kernels': their MACs are the products' own
    assert [k.cost.macs for k in cuda[r.groups[0].id] if k.cls == "gemm"] == [s * d * s] * 2
    est = analyze(path, hardware=["a100"], runtime=NATIVE_CUDA).estimates["a100"]
    plain = analyze(path, hardware=["a100"]).estimates["a100"]
    (group,) = est.groups.values()
    (one,) = plain.groups.values()
    assert est.profile.runtime.name == NATIVE_CUDA and not est.calibrated
    # four launches against the one kernel of the uncalibrated default
    assert group.overhead_s == pytest.approx(4 * one.overhead_s)

    gather = [helper.make_node("Gather", ["x", "i"], ["g"], axis=0),
              helper.make_node("Relu", ["g"], ["y"])]
    index = numpy_helper.from_array(np.array([0, 2], np.int64), "i")
    path = _save(tmp_path, gather, [index], [4, 8], [2, 8])
    r, cuda = _kernels(path, NATIVE_CUDA_MODEL)
    gathered = next(g for g in r.groups if "Gather_0" in g.nodes)
    assert [k.nodes for k in cuda[gathered.id]] == [tuple(gathered.nodes)]


def test_native_cuda_needs_a_gpu_profile() -> None:
    with pytest.raises(UsageError, match="runs on a GPU"):
        resolve_target("host", 1, NATIVE_CUDA)
    with pytest.raises(UsageError, match="estimates a GPU profile"):
        resolve_target("xeon_8480", 1, NATIVE_CUDA)
