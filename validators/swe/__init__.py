"""The SWE environment's one home: repository workspaces and sandboxed commands (:mod:`.workspace`),
the tool harness that runs inside the sandbox (:mod:`.harness`), and episodes, tools and the
execution reward (:mod:`.environment`)."""
