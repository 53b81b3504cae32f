"""The verifiers tasksets and the rescoring script import verifiers, which lives in its own venv
(scripts/upstream_venv.py verifiers); pytest must not import them here."""

collect_ignore = ["vf_sums.py", "vf_moons.py", "rescore.py"]
