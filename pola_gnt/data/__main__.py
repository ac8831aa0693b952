"""`python -m pola_gnt.data [scene=NAME] [data.root=DIR] [data.factor=F]`: load a scene and print a summary."""

from omegaconf import DictConfig

from pola_gnt.config import entry_point
from pola_gnt.data.scenes import load_scene


@entry_point
def main(cfg: DictConfig) -> None:
    print(load_scene(cfg.scene, cfg.data).summary())


if __name__ == "__main__":
    main()
