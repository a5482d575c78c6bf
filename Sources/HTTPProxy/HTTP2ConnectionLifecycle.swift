import NIOHTTP2

/// When an HTTP/2 connection ends without an error: with no stream open for
/// `server.timeouts.idle` (as an idle HTTP/1.1 keep-alive connection does), on a server's
/// drain once its open streams are done, and when the client closes its side (once its open
/// streams are done). Either way the client is told which streams were
/// processed (GOAWAY with the last stream ID, NO_ERROR), so it may retry any later one on a new
/// connection (RFC 9113 §6.8). A connection error is NIOHTTP2's to answer; this only closes.
///
/// An idle client is not asked to acknowledge anything first (NIOHTTP2's connection manager
/// waits for a PING acknowledgement that a client holding connections open need never send).
struct HTTP2ConnectionLifecycle: Equatable {
    enum State: Equatable {
        /// Serving; the idle timer runs while no stream is open.
        case serving(openStreams: Int)
        /// GOAWAY sent on a drain: the open streams finish, no new one is served.
        case draining(openStreams: Int)
        case closed
    }

    enum Action: Equatable {
        case none
        case armIdleTimer
        case cancelIdleTimer
        /// GOAWAY(last stream ID, NO_ERROR), then close the connection.
        case goAwayAndClose(lastStreamID: HTTP2StreamID)
        /// GOAWAY(last stream ID, NO_ERROR); streams still open finish.
        case goAway(lastStreamID: HTTP2StreamID)
        case close
    }

    private(set) var state: State = .serving(openStreams: 0)
    /// The highest stream ID the client opened.
    private(set) var lastStreamID: HTTP2StreamID = .rootStream

    /// The connection starts with no stream: the idle timer runs.
    mutating func started() -> Action {
        guard case .serving(0) = state else { return .none }
        return .armIdleTimer
    }

    mutating func streamOpened(_ id: HTTP2StreamID) -> Action {
        if id > lastStreamID { lastStreamID = id }
        switch state {
        case .serving(let open):
            state = .serving(openStreams: open + 1)
            return open == 0 ? .cancelIdleTimer : .none
        case .draining(let open):
            // NIOHTTP2 refuses streams above the GOAWAY's ID; one below it still counts.
            state = .draining(openStreams: open + 1)
            return .none
        case .closed:
            return .none
        }
    }

    mutating func streamClosed() -> Action {
        switch state {
        case .serving(let open):
            state = .serving(openStreams: max(open - 1, 0))
            return open == 1 ? .armIdleTimer : .none
        case .draining(let open):
            if open <= 1 {
                state = .closed
                return .close
            }
            state = .draining(openStreams: open - 1)
            return .none
        case .closed:
            return .none
        }
    }

    mutating func idleTimerFired() -> Action {
        guard case .serving(0) = state else { return .none }
        state = .closed
        return .goAwayAndClose(lastStreamID: lastStreamID)
    }

    /// The server drains (`ChannelShouldQuiesceEvent`).
    mutating func quiesce() -> Action {
        switch state {
        case .serving(0):
            state = .closed
            return .goAwayAndClose(lastStreamID: lastStreamID)
        case .serving(let open):
            state = .draining(openStreams: open)
            return .goAway(lastStreamID: lastStreamID)
        case .draining, .closed:
            return .none
        }
    }

    /// The client closed its side (TCP FIN; the listener allows half-closure for HTTP/1.1's
    /// sake): it can open no stream any more. With none open the connection ends now, else
    /// when the last one does, as on a drain (their responses still reach the client).
    mutating func inputClosed() -> Action {
        switch state {
        case .serving(0):
            state = .closed
            return .close
        case .serving(let open):
            state = .draining(openStreams: open)
            return .none
        case .draining, .closed:
            return .none
        }
    }

    mutating func closed() -> Action {
        state = .closed
        return .cancelIdleTimer
    }
}
