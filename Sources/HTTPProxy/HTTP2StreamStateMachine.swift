import GatewayConfig
import NIOCore
import NIOHPACK
import NIOHTTP1
import NIOHTTP2

/// One HTTP/2 stream as a value: its header block checked by HTTP/2's rules, then the exchange
/// it nests (the same `ExchangeStateMachine` an HTTP/1 connection nests), the stream's deadlines
/// and its end. It decides; `HTTP2StreamHandler` only runs what it decides as frames and calls.
struct HTTP2StreamStateMachine {
    typealias X = ExchangeStateMachine

    enum State {
        /// Waiting for the request's header block.
        case head
        case exchange(X)
        /// Answered, reset or gone.
        case done
    }

    enum Action {
        case none
        /// Run the exchange's action.
        case exchange(X.Action)
        /// The request was admitted: ask its route's guard.
        case askGuard
        /// `RST_STREAM` with this code, then close the stream: nothing was answered.
        case reset(HTTP2ErrorCode)
    }

    /// What the stream's close leaves to do.
    enum Ending {
        case nothing
        /// The exchange was forwarded: recorded as the client's abort.
        case record(X)
        /// Nothing was answered or sent upstream: its places given back, nothing recorded.
        case release(ExchangeLease)
    }

    /// A stream carries one exchange, and its answers come back to this stream: the exchange's id
    /// (which tells an HTTP/1 connection's answers apart) is never read here.
    static let exchangeID: UInt64 = 1
    /// HTTP/2 streams are logged as such.
    static let version = HTTPVersion(major: 2, minor: 0)

    private(set) var state: State = .head
    /// When the client last sent something on the stream (or the stream began).
    var lastActivity: NIODeadline
    /// The peer is one of `server.trusted_proxies`, as of this stream's head.
    private(set) var peerTrusted = false

    init(now: NIODeadline) { lastActivity = now }

    // MARK: the client's side

    /// The request's header block. A malformed one is a stream error (RFC 9113 §8.1.1), never
    /// forwarded; one over the limits is answered 431; otherwise admission decides, as on HTTP/1.
    mutating func start(_ headers: HPACKHeaders, endStream: Bool, now: NIODeadline, shared: ProxyShared, maxHeaderListSize: Int,
                        client: IPAddress?, requestID: String, nextID: () -> UInt64) -> Action {
        guard case .head = state else { return .none }
        let limits = shared.limits
        let maxHeadBytes = max(limits.maxHeaderBytes, maxHeaderListSize)
        let request: HTTP2RequestHead
        switch HTTP2RequestHead.make(headers, endStream: endStream, maxHeadBytes: maxHeadBytes, maxFields: limits.maxHeaderCount) {
        case .success(let made): request = made
        case .failure(let refusal) where refusal.isStreamError:
            state = .done
            return .reset(refusal.errorCode)
        case .failure(let refusal):
            let log = ExchangeLog(method: .GET, version: Self.version, start: now, path: "", requestID: requestID)
            state = .exchange(X(id: Self.exchangeID, log: log, framing: .none))
            return .exchange(withExchange { $0.respond(.error(.requestHeaderFieldsTooLarge, "request head too large: \(refusal)")) } ?? .none)
        }
        let head = request.head
        var log = ExchangeLog(method: head.method, version: Self.version, start: now, path: head.target, requestID: requestID)
        let snapshot = shared.snapshot
        peerTrusted = snapshot.trusts(client)
        let admission = Admission.admit(head, snapshot: snapshot, peerTrusted: peerTrusted)
        log.note(admission, head: head, userAgent: shared.observer.wantsRequestDetails, tracing: snapshot.tracing, next: nextID)
        switch admission {
        case .admitted(let admitted):
            state = .exchange(X(id: Self.exchangeID, log: log, admitted: admitted, now: now))
            if endStream { _ = withExchange { $0.requestPart(.end(nil), now: now, responseTimeout: shared.timeouts.upstreamResponse) } }
            return .askGuard
        case .refused(let refusal):
            state = .exchange(X(id: Self.exchangeID, log: log, framing: refusal.inbound?.framing ?? .none))
            return .exchange(withExchange { $0.respond(refusal.response) } ?? .none)
        }
    }

    /// A body part, or the body's end (a DATA frame's END_STREAM, or trailers).
    mutating func requestPart(_ part: X.Part, now: NIODeadline, responseTimeout: TimeAmount) -> Action {
        guard let action = withExchange({ $0.requestPart(part, now: now, responseTimeout: responseTimeout) }) else { return .none }
        return .exchange(action)
    }

    /// Whether the stream is read: while the exchange can take what it sends (as on HTTP/1).
    /// Mutating only to look at the exchange in place (a `case .exchange(let x)` copied it, with
    /// a retain and release of everything it holds, on every read).
    mutating func wantsRead() -> Bool {
        switch state {
        case .head: return true
        case .done: return false
        case .exchange:
            return withExchange { x in
                ExchangeRules.shouldReadClient(phase: x.phase, quiescing: false, requestEnded: x.body.ended, pipelinedEmpty: true,
                                               upstreamWritable: x.upstream?.isWritable ?? false)
            } ?? false
        }
    }

    /// The stream closed (the client reset it, the connection went, or it ended): an exchange
    /// still open is the client's abort. The upstream connection, if any, is to be closed.
    mutating func streamClosed() -> (Ending, upstream: UpstreamConnection?) {
        defer { state = .done }
        guard case .exchange(var x) = state else { return (.nothing, nil) }
        let upstream = x.upstream  // before the client's leaving ends the exchange
        switch x.state {
        case .ended: return (.nothing, upstream)
        case .forwarding:
            // As on HTTP/1: recorded as the client's abort (499 unless a response began).
            _ = x.clientLeft()
            return (.record(x), upstream)
        default:
            return (.release(x.lease), upstream)
        }
    }

    /// The exchange ended (answered, finished or aborted): taken out, moved rather than copied;
    /// the stream takes nothing more.
    mutating func end() -> X? {
        var taken = State.done
        swap(&taken, &state)
        guard case .exchange(let x) = consume taken else { return nil }
        return x
    }

    // MARK: time

    /// When the stream's timer must fire: the idle timeout, the head's deadline while it is
    /// awaited, or the exchange's own (a body's allowance, the response's timeout).
    /// (Mutating only to look at the exchange in place.)
    mutating func deadline(_ timeouts: ProxyConfiguration.Timeouts) -> NIODeadline {
        var deadline = lastActivity + timeouts.idle
        switch state {
        case .head:
            deadline = min(deadline, lastActivity + timeouts.requestHead)
        case .exchange:
            if let eager = withExchange({ $0.deadline(bodyAllowance: timeouts.requestBody) }) ?? nil { deadline = min(deadline, eager) }
        case .done:
            break
        }
        return deadline
    }

    /// The timer fired at `now`: what is due. `.none`: nothing yet (re-arm).
    mutating func timerFired(now: NIODeadline, _ timeouts: ProxyConfiguration.Timeouts) -> Action {
        switch state {
        case .done: return .none
        case .head:
            // The header block never completed in time (NIOHTTP2 holds a partial one).
            guard lastActivity + timeouts.requestHead <= now || lastActivity + timeouts.idle <= now else { return .none }
            state = .done
            return .reset(.cancel)
        case .exchange:
            if let action = withExchange({ $0.timerFired(now: now, bodyAllowance: timeouts.requestBody) }), !action.isNone { return .exchange(action) }
            if lastActivity + timeouts.idle <= now, let action = withExchange({ $0.idleTimeout() }) { return .exchange(action) }
            return .none
        }
    }

    // MARK: the exchange in place

    /// Runs `event` on the exchange in place: it is moved out of the state and back (swap), never
    /// copied (as `ClientConnectionStateMachine` does). nil without an exchange.
    @discardableResult
    mutating func withExchange<R>(_ event: (inout X) -> R) -> R? {
        guard case .exchange = state else { return nil }
        var taken = State.done
        swap(&taken, &state)
        guard case .exchange(var x) = consume taken else { return nil }
        let result = event(&x)
        state = .exchange(x)
        return result
    }
}
