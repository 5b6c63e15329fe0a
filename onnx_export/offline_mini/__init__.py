"""The built-in offline model: EfficientNet-Lite0 + MiniLM backbones, projections, alignment recipe, weights.
Torch side: imports torch, d2s_onnx_export's factory parts and d2s_search's runtime helpers; ``fallback`` alone is torch-free.
"""
