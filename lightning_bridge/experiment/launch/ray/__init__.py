"""The Ray launcher: trials placed and supervised on a Ray cluster (`run --launcher ray`)."""
