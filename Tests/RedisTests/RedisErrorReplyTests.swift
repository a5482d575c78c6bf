import Redis
import Testing

@Suite("Redis error replies, by kind")
struct RedisErrorReplyTests {
    @Test("each reply real servers send is read into the kind code acts on", arguments: [
        ("READONLY You can't write against a read only replica.", RedisErrorReply.Kind.readOnly),
        ("LOADING Redis is loading the dataset in memory", .loading),
        ("MOVED 3999 10.0.0.7:6380", .moved(RedisAddress(host: "10.0.0.7", port: 6380))),
        ("ASK 3999 [::1]:7000", .ask(RedisAddress(host: "::1", port: 7000))),
        ("MOVED 3999", .other),
        ("MOVED 3999 10.0.0.7:70000", .other),
        ("TRYAGAIN Multiple keys request during rehashing of slot", .tryAgain),
        ("CLUSTERDOWN The cluster is down", .clusterDown),
        ("NOSCRIPT No matching script. Please use EVAL.", .noScript),
        ("OOM command not allowed when used memory > 'maxmemory'.", .outOfMemory),
        ("BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.", .busy),
        ("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.", .masterDown),
        ("NOAUTH Authentication required.", .authentication),
        ("WRONGPASS invalid username-password pair or user is disabled.", .authentication),
        ("ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?", .authentication),
        ("ERR invalid password", .authentication),
        ("ERR Client sent AUTH, but no password is set", .authentication),
        ("NOPERM User app has no permissions to run the 'keys' command", .noPermission),
        ("ERR unknown command 'FLUSHALL', with args beginning with: ", .unknownCommand),
        ("ERR DB index is out of range", .noDatabase),
        ("WRONGTYPE Operation against a key holding the wrong kind of value", .other),
        ("ERR syntax error", .other),
        ("READONLYX not a kind", .other),
        ("", .other),
    ])
    func kinds(message: String, kind: RedisErrorReply.Kind) {
        let reply = RedisErrorReply(message)
        #expect(reply.kind == kind, "\(message)")
        #expect(reply.message == message, "the text is kept for the log")
    }

    @Test("a refused command is one the ACL or a rename forbids, not any error")
    func refusedCommands() {
        #expect(RedisError.server("NOPERM User app has no permissions to run the 'eval' command").isRefusedCommand)
        #expect(RedisError.server("ERR unknown command 'EVALSHA'").isRefusedCommand)
        #expect(!RedisError.server("READONLY You can't write against a read only replica.").isRefusedCommand)
        #expect(!RedisError.timeout.isRefusedCommand)
    }
}
