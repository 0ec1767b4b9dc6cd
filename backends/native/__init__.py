"""The native executor's plan: the analyzer's fused groups lowered to kernels of the C++ core.

`plan.build_plan` turns an `AnalysisResult` into a `Plan` (tensors, arena offsets, one step per
fused group); `backends.native_cpu` runs it through the extension `onnxlens.backends._native`,
built from `src/`, `include/` and `bindings.cpp` here.
"""
