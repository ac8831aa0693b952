"""Polarity attention of queries over keys of any length (`op.polarity_attention`): the quadratic and
chunked linear PyTorch forms (`pytorch_form`) and the fused Triton kernel of the linear form
(`triton_form`). No C++ form: GNT's attentions on the CPU are the view and ray ops'."""
