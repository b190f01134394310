"""The cockpit's trainer: a separate process, profile in, record out (`python -m trainer --help`).

`__cockpit_trainer__` marks this package as the cockpit's own: other projects publish packages named
`trainer` too, and the supervisor refuses to launch one without this marker (`cockpit.service.supervisor`).
"""

__cockpit_trainer__ = True
