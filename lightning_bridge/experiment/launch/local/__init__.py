"""The local launcher's machinery: the warm process that forks trials with their imports
done, and what this machine can hold (GPUs, processes)."""
