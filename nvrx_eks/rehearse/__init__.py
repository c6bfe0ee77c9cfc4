"""`nvrx-eks rehearse`: the rendered JobSet's own pods, run in podman on this machine under their
own security context and containerd's default seccomp profile, from a CPU twin of the trainer
image (runner, pods, jobset, image, runtime)."""
