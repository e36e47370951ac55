//go:build !linux

package agent

func (a *Agent) raiseSamplingPriority() { a.self.setScheduling("normal (own thread)") }
