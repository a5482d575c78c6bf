import Testing

/// One row of a state machine's table (`ClientConnectionStateMachineTests`,
/// `HTTP2StreamStateMachineTests`): in `stage`, `event` gives `action` and leaves the machine
/// in `after`, both as the table writes them.
struct TransitionRow<Stage: RawRepresentable & Sendable, Event: RawRepresentable & Sendable>: Sendable, CustomTestStringConvertible
where Stage.RawValue == String, Event.RawValue == String {
    let stage: Stage
    let event: Event
    let action: String
    let after: String
    var testDescription: String { "\(stage.rawValue) + \(event.rawValue) → \(action), \(after)" }

    init(_ stage: Stage, _ event: Event, _ action: String, _ after: String) {
        self.stage = stage
        self.event = event
        self.action = action
        self.after = after
    }
}
