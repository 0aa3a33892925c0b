"""The Ray launcher: trials placed and supervised on a Ray cluster (`run --launcher ray`): the
launcher (`_launcher`), what a trial asks of the cluster (`_settings`), a trial on the cluster
and its handle (`_placement`), reaching the cluster (`_cluster`) and the actors on its nodes
(`_actors`)."""
