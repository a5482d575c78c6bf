/// The rule of every allocation-count test: a count above the committed one (by more than
/// `slack`, for timers that fire per second rather than per request) fails, and so does a count
/// well below it, so that a saving is written down where the next change can lose it.
/// - Returns: what is wrong, or nil.
public func allocationProblem(_ measured: Double, committed: Int, slack: Double = 0, per unit: String = "request") -> String? {
    if measured > Double(committed) + slack { return "more allocations per \(unit) than committed (\(committed)): \(measured)" }
    if measured < Double(committed) * 0.9 - 1 { return "fewer allocations per \(unit) than committed (\(committed)): \(measured); write the new count down" }
    return nil
}
