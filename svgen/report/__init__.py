"""Reports on top of the pipeline: warnings about a plan (`lint`), `svgen inspect`'s text
(`inspect_text`) and the tile-map pictures (`pictures`)."""
