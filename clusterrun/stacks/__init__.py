"""Every rank's Python stack in a live run: collected on the hosts (remote/tools/stackdump.py, with
py-spy), grouped by identical stack, odd ranks out first. ``collect`` is the reusable entry
point (`clusterrun stacks`, the stall watchdog's report)."""
