"""The local launcher: trials on this machine (`_launcher`; a search's forked from the warm
process, `launch/_warm`), and what this machine can hold (`_machine_capacity`: GPUs,
processes)."""
