"""GNT's ray attention in polarity form, over the samples of each ray (`op.polarity_ray_attention`,
and the LePE, `op.add_lepe`): the PyTorch forms (`pytorch_form`), the fused C++ kernels (`cpu_form`)
and the fused Triton kernel (`triton_form`)."""
