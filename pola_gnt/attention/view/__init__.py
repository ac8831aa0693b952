"""GNT's view attention in polarity form, one query per point over its source views
(`op.polarity_view_attention`): the PyTorch form (`pytorch_form`), the fused C++ kernel (`cpu_form`)
and the fused Triton kernel (`triton_form`)."""
