"""The Harbor task folders here hold the tasks' own code and checks, run in their sandboxes
(tests/test.sh), never by this project's pytest: nothing below is collected."""

collect_ignore_glob = ["*/*"]
