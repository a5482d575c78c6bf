import NIOHTTP2
import Testing

@testable import HTTPProxy

/// When an HTTP/2 connection ends without an error, as a narrated sequence of events per row.
@Suite("HTTP/2 connection lifecycle")
struct HTTP2ConnectionLifecycleTests {
    typealias Action = HTTP2ConnectionLifecycle.Action
    enum Event: Sendable, CustomStringConvertible {
        case started, opened(Int), closed, idle, quiesce, inputClosed, connectionClosed
        var description: String {
            switch self {
            case .started: return "started"
            case .opened(let id): return "opened \(id)"
            case .closed: return "stream closed"
            case .idle: return "idle timer"
            case .quiesce: return "quiesce"
            case .inputClosed: return "client FIN"
            case .connectionClosed: return "connection closed"
            }
        }
    }

    static func apply(_ events: [Event]) -> [Action] {
        var machine = HTTP2ConnectionLifecycle()
        return events.map { event in
            switch event {
            case .started: return machine.started()
            case .opened(let id): return machine.streamOpened(HTTP2StreamID(id))
            case .closed: return machine.streamClosed()
            case .idle: return machine.idleTimerFired()
            case .quiesce: return machine.quiesce()
            case .inputClosed: return machine.inputClosed()
            case .connectionClosed: return machine.closed()
            }
        }
    }

    @Test("each sequence of events gives its actions", arguments: [
        ("a connection no stream is opened on ends with GOAWAY(0) when the idle timer fires",
         [.started, .idle], [.armIdleTimer, .goAwayAndClose(lastStreamID: .rootStream)]),
        ("an open stream stops the idle timer; its end starts it again",
         [.started, .opened(1), .closed], [.armIdleTimer, .cancelIdleTimer, .armIdleTimer]),
        ("a second stream neither stops nor starts the timer",
         [.started, .opened(1), .opened(3), .closed, .closed], [.armIdleTimer, .cancelIdleTimer, .none, .none, .armIdleTimer]),
        ("after streams, idle GOAWAY names the last stream opened",
         [.started, .opened(1), .opened(5), .closed, .closed, .idle], [.armIdleTimer, .cancelIdleTimer, .none, .none, .armIdleTimer, .goAwayAndClose(lastStreamID: 5)]),
        ("an idle timer that fires while a stream is open does nothing",
         [.started, .opened(1), .idle], [.armIdleTimer, .cancelIdleTimer, .none]),
        ("a drain with no stream open: GOAWAY and close at once",
         [.started, .quiesce], [.armIdleTimer, .goAwayAndClose(lastStreamID: .rootStream)]),
        ("a drain with streams open: GOAWAY, and close when the last one ends",
         [.started, .opened(1), .opened(3), .quiesce, .closed, .closed], [.armIdleTimer, .cancelIdleTimer, .none, .goAway(lastStreamID: 3), .none, .close]),
        ("a second drain changes nothing",
         [.started, .opened(1), .quiesce, .quiesce], [.armIdleTimer, .cancelIdleTimer, .goAway(lastStreamID: 1), .none]),
        ("a client's FIN with no stream open closes at once",
         [.started, .opened(1), .closed, .inputClosed], [.armIdleTimer, .cancelIdleTimer, .armIdleTimer, .close]),
        ("a client's FIN with streams open: they finish, then the connection closes",
         [.started, .opened(1), .opened(3), .inputClosed, .closed, .closed], [.armIdleTimer, .cancelIdleTimer, .none, .none, .none, .close]),
        ("a FIN during a drain changes nothing: the drain closes when its streams end",
         [.started, .opened(1), .quiesce, .inputClosed, .closed], [.armIdleTimer, .cancelIdleTimer, .goAway(lastStreamID: 1), .none, .close]),
        ("nothing fires after the connection closed",
         [.started, .connectionClosed, .idle, .quiesce], [.armIdleTimer, .cancelIdleTimer, .none, .none]),
    ] as [(String, [Event], [Action])])
    func sequence(_ name: String, _ events: [Event], _ actions: [Action]) {
        #expect(Self.apply(events) == actions, "\(name)")
    }
}
