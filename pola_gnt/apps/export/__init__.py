"""`python -m pola_gnt.export`'s library: a checkpoint's geometry for other tools. The camera set and
its renders with a confidence per pixel (`views`), the point cloud's filters and fusion (`fusion`), the
TSDF mesh (`tsdf`), depth and camera files (`files`), PLY / OBJ (`ply`), and the command's run (`run`)."""
