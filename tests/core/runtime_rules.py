"""The rules every scheduler state machine shares: the runtime double answering what the scheduler asked for
(a job ends, a start succeeds or fails, a stop ends, a ready model crashes), each through the machine's
`observe`, which checks the call."""

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule


class RuntimeAnswers:
    """Mixed into a RuleBasedStateMachine with `runtime` (a RuntimeDouble) and `observe(method, *args)`."""

    @precondition(lambda self: self.runtime.running)
    @rule(data=st.data())
    def finish(self, data):
        self.observe("finish", data.draw(st.sampled_from(sorted(self.runtime.running))))

    @precondition(lambda self: self.runtime.starts)
    @rule(data=st.data(), ok=st.booleans())
    def start_outcome(self, data, ok):
        self.observe("answer_start", data.draw(st.sampled_from(sorted(self.runtime.starts))), ok)

    @precondition(lambda self: self.runtime.stops)
    @rule(data=st.data())
    def stop_done(self, data):
        self.observe("answer_stop", data.draw(st.sampled_from(sorted(self.runtime.stops))))

    @precondition(lambda self: self.runtime.up - self.runtime.stops)
    @rule(data=st.data())
    def crash(self, data):
        self.observe("crash", data.draw(st.sampled_from(sorted(self.runtime.up - self.runtime.stops))))
