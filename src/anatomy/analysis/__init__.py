"""The anatomy of a model, derived from the real modules: params (ledger), flops (analytic,
checked against FlopCounterMode), memory (weights, KV cache, measured activations), trace (shapes
recorded on the meta device), hardware and roofline, diagram, and report/render/plot for
`anatomy inspect` and `anatomy compare`."""
