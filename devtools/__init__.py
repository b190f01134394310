"""Tools for working on the cockpit in its checkout (not packaged): the layers table and its checks, the
import graph, the fault drills."""
