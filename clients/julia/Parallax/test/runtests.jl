# Tests against a running parallaxd at ENV["PARALLAX_SOCKET"] (see clients/julia/README.md).
# Not run by ctest: Julia is not installed where the project is built.
using Test
using Parallax

const SOCKET = get(ENV, "PARALLAX_SOCKET", "")
isempty(SOCKET) && error("set PARALLAX_SOCKET to a running parallaxd's socket")
jobname(tag) = "julia-$tag-$(getpid())-$(time_ns())"
client(job; rank = 0, size = 1) =
    Parallax.connect(socket = SOCKET, job = job, local_rank = rank, local_size = size,
                     timeout = 20, arena_bytes = 8 << 20)

# The exception f throws, or nothing.
function caught(f)
    try
        f()
    catch err
        return err
    end
    return nothing
end

# One of two workers: step 0, then a step rank 0 waits on too briefly (rank 1 submits it
# only after a barrier), then both complete it.
function two_workers(job, rank)
    c = client(job; rank = rank, size = 2)
    v = register_dense(c, "g", Int64, 2; op = :sum)
    buf = Int64[rank + 1, 10]
    wait(allreduce!(v, buf))
    timed_out = true
    if rank == 0
        r = allreduce!(v, buf)
        e = caught(() -> wait(r; timeout = 0.1))
        timed_out = e isa ParallaxError && e.status == Parallax.PX_ERR_TIMEOUT
        barrier(c)
        wait(r)
        close(r)
    else
        barrier(c)
        wait(allreduce!(v, buf))
    end
    close(c)
    return (buf, timed_out)
end

@testset "Parallax" begin
    @testset "one worker" begin
        c = client(jobname("one"))
        w = world(c)
        @test (w.rank, w.world_size, w.local_size) == (0, 1, 1)
        @test Parallax.abi_version() == (1, 16)

        v = register_dense(c, "v", Float32, 3; op = :sum)
        buf = Float32[1, 2, 3]
        wait(allreduce!(v, buf); timeout = 20)
        @test buf == Float32[1, 2, 3]
        @test Parallax.stats(v).ops == 1

        a = alloc(c, Float32, 3)
        @test all(iszero, a)
        a .= 4
        r = allreduce!(v, a)
        wait_async(r; timeout = 20)
        close(r)
        @test a == fill(4.0f0, 3)

        e = caught(() -> allreduce!(v, Float32[1, 2]))
        @test e isa ParallaxError && e.status == Parallax.PX_ERR_INVALID
        @test occursin("2 elements, 3 expected", e.message)

        e = caught(() -> register_dense(c, "v", Float64, 3))
        @test e isa ParallaxError && e.status == Parallax.PX_ERR_MISMATCH

        t = register_sparse(c, "t", 10, 2; optimizer = :sgd, learning_rate = 0.5)
        wait(load_rows(t, Int64[1, 3], Float32[1, 1.5, 3, 3.5]))
        rows = Matrix{Float32}(undef, 2, 2)       # dim x n: a table row per column
        wait(pull_rows!(t, rows, Int64[1, 3]))
        @test rows == Float32[1 3; 1.5 3.5]
        wait(push_rows(t, Int64[1, 3, 3], ones(Float32, 6)))
        wait(pull_rows!(t, rows, Int64[1, 3]))
        @test rows == Float32[0.5 2; 1 2.5]
        out = zeros(Float32, 2)
        wait(read_rows!(t, out, Int64[3]))
        @test out == Float32[2, 2.5]

        e = caught(() -> wait(pull_rows!(t, zeros(Float32, 4), Int64[3, 1000])))
        @test e isa ParallaxError && e.status == Parallax.PX_ERR_INDEX
        @test occursin("1000", e.message)

        e = caught(() -> register_sparse(c, "bad", 10, 2; learning_rate = -1.0))
        @test e isa ParallaxError && e.status == Parallax.PX_ERR_INVALID

        close(a)
        close(c)
        @test !isopen(c)
    end

    if Threads.nthreads() >= 2  # px_connect blocks until both workers connected
        @testset "two workers" begin
            job = jobname("two")
            tasks = map(rank -> Threads.@spawn(two_workers(job, rank)), 0:1)
            results = fetch.(tasks)
            @test all(r -> r[1] == Int64[6, 40] && r[2], results)
        end
    end
end
