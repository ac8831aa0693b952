"""Applications of a trained run, above the training run (`runs`): loading a run's checkpoint for
`eval`, `render_video`, `view` and `analyze` (`trained_runs`), fly-through videos (`video`), the web
viewer (`viewer`), the frames both render (`frames`), nerfstudio's camera_path.json
(`camera_path_file`) and geometry export (`export/`). They import `runs` and below, never `interop`."""
