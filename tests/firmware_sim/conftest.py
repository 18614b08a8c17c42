"""LSL isolation for this test folder: a private lsl_api.cfg (unique SessionID, machine scope, quiet)."""

from tests.lsl_support import configure_lsl

configure_lsl()  # must run before anything loads liblsl
