# The SDK's gradient reducer: its bucket assignment, and the Reducer itself and
# the checks that every rank holds the same model, with ranks as threads over
# Gloo in one process. Included from tests/CMakeLists.txt.
add_executable(test_reducer unit/main.cpp unit/test_bucket_assignment.cpp unit/test_reducer.cpp
  unit/test_replica_check.cpp)
target_include_directories(test_reducer PRIVATE ${PROJECT_SOURCE_DIR}/sdk/src)
target_link_libraries(test_reducer PRIVATE trainrun::sdk doctest::doctest)
doctest_discover_tests(test_reducer PROPERTIES TIMEOUT 300)

# What train::report's divergence check costs against a training step
# (tools/bench/divergence_bench.cpp; not a test).
add_executable(divergence_bench ${PROJECT_SOURCE_DIR}/tools/bench/divergence_bench.cpp)
target_include_directories(divergence_bench PRIVATE ${PROJECT_SOURCE_DIR}/sdk/src)
target_link_libraries(divergence_bench PRIVATE trainrun::sdk CLI11::CLI11)
