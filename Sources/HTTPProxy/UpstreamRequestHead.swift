import NIOCore
import NIOHTTP1

/// The head a forwarded request goes upstream with, written as bytes: the request line (the
/// route's target, HTTP/1.1), the client's field lines copied as received except those
/// `RequestHeaderRules` removed or rewrote (`InboundRequest.edits`) and those the guard asked
/// to remove, then what the proxy adds. Unchanged lines are copied in runs, never re-encoded.
struct UpstreamRequestHead {
    var method: HTTPMethod
    var target: String
    /// Names the guard removes (`Authorization` carrying the gateway's own token), lower-cased;
    /// a removal wins over the rules' rewrite of the same field.
    var removing: [String] = []
    /// The route sets its own `Host` (`upstream_host`): the client's is not sent.
    var replacesHost = false
    /// Fields the proxy adds after the client's (forwarding headers, the request id, identity).
    var adding: [(String, String)] = []

    /// The head of a request the guard admitted with `.forward`: the route's target, the guard's
    /// removals, then the forwarding fields (`X-Forwarded-*` extended with `client`, `Host` when
    /// the route sets one or the client sent none), the request id, the trace context (`trace`:
    /// the upstream span) and the guard's fields (any with a control character left out);
    /// `closing`: `Connection: close` (the connection serves this request only, and the app is
    /// told not to read on after its answer).
    static func forwarding(_ inbound: InboundRequest, method: HTTPMethod, target: RequestTarget, route: ProxyRoute, requestID: String,
                           client: String, scheme: String, adding extra: [(String, String)], removing: [String],
                           closing: Bool = false, trace: TraceContext? = nil) -> UpstreamRequestHead {
        var head = UpstreamRequestHead(method: method, target: route.upstreamTarget(target), removing: removing.map { $0.lowercased() },
                                       replacesHost: route.upstreamHost != nil)
        head.adding.reserveCapacity(7 + extra.count)
        head.adding.append(("X-Forwarded-For", inbound.forwardedFor.map { "\($0), \(client)" } ?? client))
        head.adding.append(("X-Forwarded-Proto", inbound.forwardedProto ?? scheme))
        if let host = inbound.host?.authority { head.adding.append(("X-Forwarded-Host", host)) }
        if let host = route.upstreamHost {
            head.adding.append(("Host", host))
        } else if inbound.host == nil {
            head.adding.append(("Host", route.upstream.description))
        }
        head.adding.append(("X-Request-Id", requestID))
        if let trace {
            head.adding.append(("traceparent", trace.traceparent))
            if let state = trace.state { head.adding.append(("tracestate", state)) }
        }
        if closing { head.adding.append(("Connection", "close")) }
        for (name, value) in extra where HTTPWire.isSafeValue(value) && HTTPWire.isSafeValue(name) {
            head.adding.append((name, value))
        }
        return head
    }

    func write(_ inbound: InboundRequest, into buffer: inout ByteBuffer) {
        buffer.writeString(method.rawValue)
        buffer.writeStaticString(" ")
        buffer.writeString(target)
        buffer.writeStaticString(" HTTP/1.1\r\n")
        let head = inbound.head
        var edits = inbound.edits[...]
        head.bytes.withUnsafeReadableBytes { raw in
            var runStart = Int(head.fieldsStart)
            var runEnd = runStart
            for (index, field) in head.fields.enumerated() {
                var replacement: String? = nil
                var keep = true
                if let edit = edits.first, edit.index == index {
                    edits = edits.dropFirst()
                    keep = false
                    replacement = edit.value
                }
                if (replacesHost && head.nameIs(field, "host")) || (!removing.isEmpty && removing.contains(where: { head.nameEquals(field, $0) })) {
                    keep = false
                    replacement = nil
                }
                if keep {
                    runEnd = Int(field.lineEnd)
                    continue
                }
                if runEnd > runStart { buffer.writeBytes(UnsafeRawBufferPointer(rebasing: raw[runStart..<runEnd])) }
                if let replacement {
                    buffer.writeBytes(UnsafeRawBufferPointer(rebasing: raw[Int(field.nameStart)..<Int(field.nameStart + field.nameLength)]))
                    buffer.writeStaticString(": ")
                    buffer.writeString(replacement)
                    buffer.writeStaticString("\r\n")
                }
                runStart = Int(field.lineEnd)
                runEnd = runStart
            }
            if runEnd > runStart { buffer.writeBytes(UnsafeRawBufferPointer(rebasing: raw[runStart..<runEnd])) }
        }
        if let upgrade = inbound.upgrade {
            buffer.writeStaticString("Connection: Upgrade\r\n")
            HTTPWire.writeHeader("Upgrade", upgrade, into: &buffer)
        }
        for (name, value) in adding { HTTPWire.writeHeader(name, value, into: &buffer) }
        buffer.writeStaticString("\r\n")
    }
}
