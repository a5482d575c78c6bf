import ArgumentParser
import Foundation
import Gateway
import GatewayConfig
import Logging
import NIOPosix
import ServiceLifecycle

#if canImport(Glibc)
import Glibc
#endif

@main
struct SessionGateCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sessiongate",
        abstract: "A reverse proxy that admits only requests backed by a Sign in with Apple session.",
        discussion: """
            Configuration reference: conf/sessiongate.yaml (every key, annotated, with its default).
            SIGHUP re-reads the configuration; SIGTERM or SIGINT drains in-flight requests and exits.
            """,
        subcommands: [Serve.self, Check.self, Demo.self, AppleSimulatorCommand.self],
        defaultSubcommand: Serve.self
    )
}

struct ConfigOption: ParsableArguments {
    @Option(name: .long, help: "Path of the YAML configuration file.")
    var config: String = "conf/sessiongate.yaml"
}

/// Loads a configuration, printing every problem; nil when there are errors.
func loadConfiguration(_ path: String, printWarnings: Bool = true) -> GatewayConfiguration? {
    let result = GatewayConfiguration.load(file: path)
    for problem in result.problems where problem.severity == .error || printWarnings {
        printError("\(path):\(problem)")
    }
    return result.configuration
}

func printError(_ line: String) {
    var text = line + "\n"
    text.withUTF8 { buffer in _ = write(2, buffer.baseAddress, buffer.count) }
}

func makeLogger() -> Logger {
    var logger = Logger(label: "sessiongate") { StreamLogHandler.standardError(label: $0) }
    logger.logLevel = .info
    return logger
}

struct Serve: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Run the gateway.")

    @OptionGroup var options: ConfigOption

    func run() async throws {
        guard let configuration = loadConfiguration(options.config) else { throw ExitCode(1) }
        let logger = makeLogger()
        let service: GatewayService
        do {
            service = try GatewayService(configuration: configuration, configPath: options.config, logger: logger)
        } catch {
            printError("\(options.config): \(error)")
            throw ExitCode(1)
        }
        let group = ServiceGroup(configuration: .init(
            services: [.init(service: service)],
            gracefulShutdownSignals: [.sigterm, .sigint],
            logger: logger))
        try await group.run()
    }
}

struct Check: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Validate a configuration file.",
        discussion: "Prints every problem with its key path and line:column, or 'ok'. Exit status 1 if there is any error.")

    @OptionGroup var options: ConfigOption

    func run() throws {
        let result = GatewayConfiguration.load(file: options.config)
        for problem in result.problems { print("\(options.config):\(problem)") }
        guard result.configuration != nil else { throw ExitCode(1) }
        print("ok")
    }
}

struct Demo: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run the demo: a demo upstream and the gateway in front of it, on loopback.",
        discussion: "The demo upstream listens on the address of the first route's upstream in the configuration (conf/demo.yaml: 127.0.0.1:9000).")

    @Option(name: .long, help: "Path of the demo configuration.")
    var config: String = "conf/demo.yaml"

    func run() async throws {
        guard let configuration = loadConfiguration(config), let route = configuration.routes.first else { throw ExitCode(1) }
        let logger = makeLogger()
        let upstream = try await DemoUpstream.start(host: route.upstream.host, port: route.upstream.port, group: MultiThreadedEventLoopGroup.singleton)
        let service = try GatewayService(configuration: configuration, configPath: config, logger: logger)
        let group = ServiceGroup(configuration: .init(
            services: [.init(service: service)],
            gracefulShutdownSignals: [.sigterm, .sigint],
            logger: logger))
        let banner = Task {
            await service.waitUntilStarted()
            let listen = configuration.server.listen
            let host = listen.host == "0.0.0.0" ? "127.0.0.1" : listen.host
            // Unbuffered, so the URL shows at once even when the output is piped (make, tee).
            FileHandle.standardOutput.write(Data("""

                SessionGate demo is running.
                  Open:      http://\(host):\(service.proxyAddress?.port ?? listen.port)/
                  Upstream:  \(route.upstream) (the demo app; it shows the headers it receives)
                  Metrics:   http://\(configuration.server.adminListen.host):\(configuration.server.adminListen.port)/metrics
                Ctrl-C stops it.

                """.utf8))
        }
        try await group.run()
        banner.cancel()
        await upstream.close()
    }
}
