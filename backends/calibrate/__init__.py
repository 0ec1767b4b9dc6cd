"""`onnxlens calibrate`: time micro-benchmarks through ONNX Runtime's CPU provider, fit a
`Calibration` (analyzer/calibration.py) and save it in the user's cache dir.

Each micro-benchmark is a small ONNX graph built with onnx.helper that our fusion makes one
group of (one op, or a pattern ORT also runs as one kernel: Conv + activation, a Linear with
its bias and GELU, an attention block): GEMMs from skinny to square, convolutions 3x3 / 1x1 /
strided / grouped / the 3-channel stem, with channel counts on and off ORT's NCHWc block,
depthwise 3x3 / 5x5 / 7x7, elementwise ops, pools, normalizations, reductions and data
movement at sizes that span L1, L2, the last-level cache and DRAM, and a chain of tiny ops for
the per-kernel overhead. Shapes come from generic grids whose spatial sizes (96, 48, 24, 12,
6; 208 for the stems) no torchvision classifier at 224x224 has, so no benchmark is a layer of
a model the accuracy benchmark measures. Its FLOPs and bytes come from onnxlens's own
analysis of that graph (the formulas the estimate uses), so model and measurement check each
other, and its op class is the estimator's (`op_class`).

Measuring: inputs are graph inputs, weights initializers (ORT prepacks them, as in a model).
A benchmark's time is the median of its runs, on the CPU-time clock at one thread (immune
to other processes on the cores) and wall time otherwise, less the fixed cost of a `run` call.
A lone Conv or pool is run by ORT in its NCHWc layout between a ReorderInput and a
ReorderOutput, which in a network sit only at the ends of a run of convolutions: such a
benchmark is timed as ORT optimized it (its saved optimized graph) with those layout kernels
cut off, so what is timed is the `com.microsoft.nchwc` kernel a network runs. Each
benchmark's session is made once and timed in five passes over the whole list, alternately
forwards and backwards, keeping its fastest median: on a shared machine other processes slow
things down in bursts (caches and memory bandwidth are shared even when the CPU clock is
not), which rarely hit one benchmark every time.

Fitting, in the estimator's terms (a group takes max(compute, memory) + overhead):

1. overhead: the slope of run time over the length of a chain of tiny Relu kernels, and its
   intercept, a run call's own fixed cost, which the estimator adds once a model
   (`run_call_us`); through ORT's CPU provider, a small copy's fixed cost beyond the slope
   (Slice, Gather, Expand, Split and Concat, and per part of the last two) from chains of
   them (`fit_copy_fixed`);
2. the fp32 peak: the host profile's, raised to the best GEMM rate measured if that beats it
   (efficiencies measured above the peak count as 1); the rate of the 1024^3 GEMM is kept as
   the "measured GEMM peak" a naive estimate would use;
3. memory bandwidth per level, the `elementwise` curve and the cost of a transcendental τ
   (`fit_vector`), on every benchmark without MACs: for each τ on a grid, alternately (four
   rounds) a level's bandwidth is the median rate of its benchmarks that the current curve
   calls memory bound and the curve (no reuse factor) is fitted on those the bandwidths call
   compute bound, its work in plain-FLOP equivalents (`Cost.vector_flops`); a level slower
   than the one after it is raised to it; the τ whose fit predicts the benchmarks' times best
   wins (plain ops such as Relu pin the bandwidths, transcendental ones the curve);
4. a curve of its own for pools, normalizations and reductions, on all their benchmarks
   (`fit_vector_classes`);
5. a curve per class with MACs, on all its benchmarks, its rate taken over all the work of
   the kernel: its MACs and its epilogue (bias, ReLU), which the estimator charges at the
   kernel's rate (`estimate_group`), after taking out the time of an activation MLAS applies
   in a pass after the kernel (ReLU6, HardSwish: at the `elementwise` rate,
   `activation_pass`). A benchmark's streamed bytes at the fitted bandwidths bound what the
   curve is asked to explain: where a curve puts its compute time under that memory time,
   the estimator's max(compute, memory) is the memory time, and so is the fit's (`fit_curve`'s
   floor). No cut decides which benchmarks are memory bound, so none flips with the host.

`fit_check` then asks the estimator for each benchmark's time on the calibrated profile: how
well the fitted model explains what it was fitted on, per class (`onnxlens calibrate` prints
it).
   Classes are the estimator's on the runtime measured: through ORT, a grouped convolution
   ORT runs off its NCHWc path is `grouped_conv`, a depthwise one (output channels not a
   multiple of 4, or a channel multiplier) `depthwise_nchw`.

`--backend native-cpu` (`run_calibration(backend=...)`) times the same graphs on the
project's own executor instead (one step per group, nothing cut off; graphs it cannot run
are left out) and saves a calibration of its own.

A curve is fitted by least absolute deviations on ln(efficiency): for each f_half on a log
grid, the i_half (on a grid) that fits the most common memory level's benchmarks best, with
the best e_max closed-form (the median log residual); then each other memory level with
enough benchmarks gets the i_half factor (on a grid) that fits its benchmarks best, and e_max
is refitted on all; the f_half whose curve fits all benchmarks best wins (a cost per call is
the same whatever level the operands sit in). Benchmarks run in
priority order (a coarse set covering every class first), and those that would overrun
`budget_s` are skipped.
"""
