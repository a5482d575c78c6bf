import GatewayConfig
import NIOCore
import NIOHTTP1

/// An HTTP/1 request head arrives: admission (`Admission.admit`, the same for every protocol)
/// decides whether the guard is asked, and what HTTP/1 adds — whether the client keeps the
/// connection, its request id, its user agent for the log — goes with the exchange.
extension ClientConnectionStateMachine {
    mutating func startExchange(_ head: WireHead, now: NIODeadline) -> Action {
        var log = ExchangeLog(method: head.method, version: head.version, start: now, path: head.target, requestID: nextRequestID())
        let id = nextExchange()
        let (snapshot, trusted) = currentRouting()
        peer.trusted = trusted
        let admission = Admission.admit(head, snapshot: snapshot, peerTrusted: trusted)
        log.note(admission, head: head, userAgent: shared.observer.wantsRequestDetails, tracing: snapshot.tracing) { nextID() }
        let inbound = admission.inbound
        // What HTTP/1 reads of the head: the connection after this exchange.
        var keepAlive = false
        if let inbound {
            keepAlive = inbound.keepAlive && !quiescing && !inbound.isWebSocketUpgrade
            if inbound.upgrade == nil, head.fields.contains(where: { head.nameIs($0, "upgrade") }) {
                // e.g. h2c: served as plain HTTP/1.1 without the upgrade, then closed (the
                // reader stops parsing after an upgrade request).
                keepAlive = false
            }
        }
        switch admission {
        case .admitted(let admitted):
            state = .exchange(ExchangeStateMachine(id: id, log: log, admitted: admitted, now: now), keepAlive: keepAlive)
            return .admit(exchange: id, admitted.route)
        case .refused(let refusal):
            state = .exchange(ExchangeStateMachine(id: id, log: log, framing: inbound?.framing ?? .none), keepAlive: keepAlive)
            return respond(refusal.response)
        }
    }
}
