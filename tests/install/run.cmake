# Installs the built library into a fresh prefix, then configures, builds and runs the consumer
# project in tests/install against it, as a downstream user would.
#
# Expects: BINARY_DIR (the main build tree), CONSUMER_SOURCE_DIR, WORK_DIR, GENERATOR,
# MAKE_PROGRAM, CXX_COMPILER, CONFIG; optionally CUDA_TOOLKIT_ROOT.
cmake_minimum_required(VERSION 3.24)

foreach(var BINARY_DIR CONSUMER_SOURCE_DIR WORK_DIR GENERATOR CXX_COMPILER)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "run.cmake: -D${var}=... is required")
  endif()
endforeach()
if(NOT CONFIG)
  set(CONFIG Release)
endif()

# Runs one command; stops the test with its output if it fails.
function(run_step name)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${name} failed (${rc}):\n${out}")
  endif()
  message(STATUS "${name}: ok")
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

set(prefix ${WORK_DIR}/prefix)
set(consumer_build ${WORK_DIR}/build)
file(REMOVE_RECURSE ${WORK_DIR})

run_step("install" ${CMAKE_COMMAND} --install ${BINARY_DIR} --config ${CONFIG} --prefix ${prefix})

set(configure_args -S ${CONSUMER_SOURCE_DIR} -B ${consumer_build} -G ${GENERATOR}
  -DCMAKE_BUILD_TYPE=${CONFIG} -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCMAKE_PREFIX_PATH=${prefix})
if(MAKE_PROGRAM)
  list(APPEND configure_args -DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM})
endif()
if(CUDA_TOOLKIT_ROOT)
  list(APPEND configure_args -DCUDAToolkit_ROOT=${CUDA_TOOLKIT_ROOT})
endif()
run_step("configure consumer" ${CMAKE_COMMAND} ${configure_args})
run_step("build consumer" ${CMAKE_COMMAND} --build ${consumer_build} --config ${CONFIG})

foreach(consumer consumer consumer17)
  find_program(${consumer}_exe ${consumer}
    PATHS ${consumer_build} ${consumer_build}/${CONFIG} NO_DEFAULT_PATH REQUIRED)
  run_step("run ${consumer}" ${${consumer}_exe})
  message(STATUS "${step_output}")
endforeach()
