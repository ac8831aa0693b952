"""Pola-GNT from Python: a checkpoint and a scene loaded as the commands load them, rendered, scored,
exported and fine-tuned by the commands' own code (`docs/python_api.md`).

    import pola_gnt

    model = pola_gnt.load_model("pretrained:pola_gnt")
    scene = pola_gnt.load_scene("fern", factor=8)
    view = model.render(scene, 0)  # the first test view, as `eval` renders it
    view.save("fern_rgb.png", "fern_depth.png")

Every function here is a layer over what a command does, with nothing computed differently:
- `load_model` is `eval`'s checkpoint loading (`runs.config.stored.trained_run_config`: the run config
  stored in the checkpoint, plus only the keys given, here as keyword arguments or `overrides`);
- `load_scene` is the commands' scene loading (`data.scene_loading.load_scene`) for the keys
  `scene=`, `scene.path=`, `data.factor=`, `data.test_views=` ...; a `Scene` remembers them, and the
  model renders and scores it under them as `eval scene=... data.factor=...` would;
- `Model.render` of a scene camera renders as `eval`'s test phase renders a held-out view
  (`GNTSystem.render_view`, sources `datamodule.eval_source_ids`); of any other camera as a video frame
  (`apps.video.render_frame`, sources `apps.frames.frame_source_views`);
- `Model.evaluate` is `eval` (`apps.evaluation.evaluate_trained`, the Lightning test phase);
- `Model.render_path` is `render_video`'s frames (`apps.video.render_frames`);
- `Model.export_points` is `export`'s point cloud (`apps.export.run`);
- `fine_tune` is `train experiment=finetune init_from=CKPT` (`runs.training.train`).

Bad input raises the commands' one-line `UserError` (`pola_gnt.core.errors`); nothing here exits.
"""

from pola_gnt.api.core import (
    Camera,
    Evaluation,
    Model,
    PointCloud,
    Progress,
    RenderCancelled,
    Rendering,
    Scene,
    UserError,
    fine_tune,
    load_model,
    load_scene,
)

# The names `pola_gnt.API_NAMES` resolves lazily; this module does not read that list (importing the
# package from here would be a circle). tests/test_api.py checks that the two agree.
__all__ = [
    "Camera",
    "Evaluation",
    "Model",
    "PointCloud",
    "Progress",
    "RenderCancelled",
    "Rendering",
    "Scene",
    "UserError",
    "fine_tune",
    "load_model",
    "load_scene",
]
