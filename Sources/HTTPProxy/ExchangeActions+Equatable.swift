import NIOCore

// The machines' actions compare as their tests read them: connections, routes and leases by
// identity, bytes by content, a response by its status, fields and body. Closures (an
// endpoint's `respond`) and verdicts' payloads are not compared.

extension WireMessagePart: Equatable {
    static func == (a: Self, b: Self) -> Bool {
        switch (a, b) {
        case (.head(let x), .head(let y)): return x.bytes == y.bytes
        case (.body(let x), .body(let y)): return x == y
        case (.end(let x), .end(let y)): return x == y
        default: return false
        }
    }
}

extension LocalResponse: Equatable {
    public static func == (a: Self, b: Self) -> Bool {
        a.status == b.status && a.close == b.close && a.body == b.body
            && a.headers.count == b.headers.count && zip(a.headers, b.headers).allSatisfy { $0 == $1 }
    }
}

extension ExchangeLog: Equatable {
    static func == (a: Self, b: Self) -> Bool {
        a.method == b.method && a.version == b.version && a.start == b.start && a.path == b.path && a.requestID == b.requestID
            && a.userAgent == b.userAgent && a.route === b.route && a.forwarded == b.forwarded && a.user == b.user && a.status == b.status
            && a.bytesSent == b.bytesSent && a.upstreamNanoseconds == b.upstreamNanoseconds
    }
}

extension ExchangeLease: Equatable {
    static func == (a: Self, b: Self) -> Bool { a.inFlight === b.inFlight && a.tunnel === b.tunnel }
}

extension ClientConnectionStateMachine.Ended: Equatable {
    static func == (a: Self, b: Self) -> Bool { a.log == b.log && a.lease == b.lease }
}

private func sameVerdict(_ a: Verdict, _ b: Verdict) -> Bool {
    switch (a, b) {
    case (.forward(_, _, let x, let u), .forward(_, _, let y, let v)): return x === y && u == v
    case (.respond(let x), .respond(let y)): return x == y
    case (.collectBody(let x, _), .collectBody(let y, _)): return x == y
    default: return false
    }
}

extension ExchangeStateMachine.Action: Equatable {
    static func == (a: Self, b: Self) -> Bool {
        switch (a, b) {
        case (.none, .none), (.askGuard, .askGuard): return true
        case (.answer(let x, _), .answer(let y, _)): return x == y
        case (.connect(let r, let p, let o), .connect(let s, let q, let n)): return r === s && p == q && o == n
        case (.startForwarding(let c, let h, let k, let p), .startForwarding(let d, let i, let l, let q)):
            return c === d && h == i && k == l && p == q
        case (.forwardBody(let c, let x), .forwardBody(let d, let y)): return c === d && x == y
        case (.forwardEnd(let c), .forwardEnd(let d)): return c === d
        case (.respond(let r, let c, let f), .respond(let s, let d, let g)): return r == s && c === d && f == g
        case (.interim(let x), .interim(let y)): return x == y
        case (.relayHead(let h, let f, let r), .relayHead(let i, let g, let s)): return h.head.bytes == i.head.bytes && f == g && r === s
        case (.relayBody(let x, let c), .relayBody(let y, let d)): return x == y && c == d
        case (.finish(let l, let c, let r), .finish(let m, let d, let s)): return l == m && c === d && r == s
        case (.abort(let c, let f), .abort(let d, let g)): return c === d && f == g
        case (.upgrade(let c, let h, let r), .upgrade(let d, let i, let s)): return c === d && h.head.bytes == i.head.bytes && r === s
        case (.closeUpstream(let c), .closeUpstream(let d)): return c === d
        case (.discard(let x), .discard(let y)): return sameVerdict(x, y)
        default: return false
        }
    }
}

extension ClientConnectionStateMachine.Action: Equatable {
    static func == (a: Self, b: Self) -> Bool {
        switch (a, b) {
        case (.none, .none): return true
        case (.admit(let i, let r), .admit(let j, let s)): return i == j && r === s
        case (.answer(let i, let x, _), .answer(let j, let y, _)): return i == j && x == y
        case (.connect(let i, let r, let p, let o), .connect(let j, let s, let q, let n)): return i == j && r === s && p == q && o == n
        case (.startForwarding(let c, let h, let m, let k, let p), .startForwarding(let d, let i, let n, let l, let q)):
            return c === d && h == i && m == n && k == l && p == q
        case (.forwardBody(let c, let x), .forwardBody(let d, let y)): return c === d && x == y
        case (.forwardEnd(let c), .forwardEnd(let d)): return c === d
        case (.write(let x), .write(let y)): return x == y
        case (.writeBody(let x, let c), .writeBody(let y, let d)): return x == y && c == d
        case (.respond(let x, let e, let c, let f, let t), .respond(let y, let g, let d, let h, let u)):
            return x == y && e == g && c === d && f == h && t == u
        case (.finish(let e, let l, let c, let r, let t), .finish(let g, let m, let d, let s, let u)):
            return e == g && l == m && c === d && r == s && t == u
        case (.abort(let e, let c, let f), .abort(let g, let d, let h)): return e == g && c === d && f == h
        case (.close(let c), .close(let d)): return c === d
        case (.upgrade(let e, let c, let h), .upgrade(let g, let d, let i)): return e == g && c === d && h == i
        case (.closeUpstream(let c), .closeUpstream(let d)): return c === d
        case (.discard(let x), .discard(let y)): return sameVerdict(x, y)
        case (.drop(let x), .drop(let y)): return x == y
        default: return false
        }
    }
}
