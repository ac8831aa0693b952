"""Checkpoints that cross the project's edge, above the training run (`runs`): GNT's own checkpoints
converted into Pola-GNT's (`gnt_checkpoints`, `convert_gnt`'s library) and the checkpoints shipped in
`pola_gnt/pretrained/`, slimmed and recorded in their manifest (`pretrained`). They import `runs` and
below, never `apps`."""
